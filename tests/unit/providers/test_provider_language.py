"""A call's language (BCP 47, `SessionSettings.language`) reaches each provider in its own field on the wire, the
fakes (which speak the real protocols) accept it, and a language a protocol cannot carry is refused: when the
adapter is built, and by `serve --config` at start (bridge/cli/ops.py), never dropped (providers/language.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bridge.cli.config import ConfigError, load
from bridge.cli.ops import RoutedApplication, server_config
from bridge.engine.commands import RecoverySnapshot
from bridge.engine.recovery import seeded_settings
from bridge.server.api import Application, CallSetup, ServerConfig, _settings
from providers.base import SessionSettings
from providers.fakes import openai_realtime as openai_fake
from providers.fakes import xai as xai_fake
from providers.fakes.gemini_live import GeminiFakeOptions
from providers.fakes.gemini_live import serve as gemini_serve
from providers.fakes.openai_live import serve as live_serve
from providers.fakes.server import FakeServer
from providers.gemini_live import GeminiConfig, GeminiLiveAdapter, setup_frame
from providers.language import gemini_language_code, iso639_1, speak_line
from providers.openai_live import LiveConfig, OpenAILiveAdapter, session_start_frame
from providers.openai_realtime import OpenAIRealtimeAdapter
from providers.realtime_family import RealtimeAdapter, RealtimeClientProtocol
from providers.xai import DIALECT as XAI_DIALECT
from providers.xai import XAIAdapter
from rtp.audio import PCM16_24K, PCMU_8K
from sip.leg import CallIdentity

GERMAN = SessionSettings(instructions="Be brief.", language="de-DE")
SPOKEN = "Be brief.\n\nSpeak German (de-DE)."


def _frames(fake: FakeServer, kind: str) -> list[dict[str, Any]]:
    return [
        f.frame
        for f in fake.connections[0].client_frames
        if f.frame is not None and (f.frame.get("type") == kind or kind in f.frame)
    ]


# --- on the wire, accepted by the fakes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "serve", "field"),
    [(OpenAIRealtimeAdapter, openai_fake.serve, "language"), (XAIAdapter, xai_fake.serve, "language_hint")],
    ids=["openai-realtime", "xai"],
)
async def test_realtime_family_sends_the_transcription_language_and_the_spoken_one(
    adapter: type[RealtimeAdapter], serve: Any, field: str
) -> None:
    async with await serve() as fake:
        provider = adapter("sk-test", GERMAN, limits=adapter.audio_limits(PCMU_8K), url=fake.url)
        await provider.connect()  # session.updated: the fake took the update
        [update] = _frames(fake, "session.update")
        session = update["session"]
        assert session["audio"]["input"]["transcription"][field] == "de"  # ISO 639-1
        assert session["instructions"] == SPOKEN  # no output-language field: the instructions say it
        await provider.close()


async def test_gpt_live_says_the_language_in_the_instructions_of_session_start() -> None:
    async with await live_serve() as fake:
        config = LiveConfig.from_settings(GERMAN)
        live = OpenAILiveAdapter(
            "sk-test", config, limits=OpenAILiveAdapter.audio_limits(PCMU_8K), url=fake.url
        )
        await live.connect()  # session.started: the strict fake took the start
        [start] = _frames(fake, "session.start")
        assert start["session"]["instructions"] == SPOKEN
        assert "language" not in str(start["session"].keys())  # no field of its own (strict config)
        await live.close()


async def test_gemini_sends_speech_config_language_code_and_the_instruction() -> None:
    async with await gemini_serve(options=GeminiFakeOptions(response_latency_ms=20)) as fake:
        live = GeminiLiveAdapter(
            "test-key-123",
            SessionSettings(instructions="Be brief.", language="de"),  # a bare language: its one listed code
            limits=GeminiLiveAdapter.audio_limits(PCM16_24K),
            url=fake.url,
            ssl_context=fake.client_ssl_context(),
        )
        await live.connect()  # setupComplete: the fake took the setup
        [setup] = [f["setup"] for f in _frames(fake, "setup")]
        assert setup["generationConfig"]["speechConfig"]["languageCode"] == "de-DE"
        assert setup["systemInstruction"]["parts"][0]["text"] == "Be brief.\n\nSpeak German (de)."
        await live.close()


def test_without_a_language_nothing_changes_on_the_wire() -> None:
    assert "languageCode" not in setup_frame(GeminiConfig())["setup"]["generationConfig"]["speechConfig"]
    assert "instructions" not in session_start_frame(LiveConfig())["session"]


# --- what a protocol cannot carry is refused --------------------------------------------------------------------


def test_languages_a_protocol_cannot_carry_are_refused_when_the_adapter_is_built() -> None:
    with pytest.raises(ValueError, match="ISO 639-1"):
        RealtimeClientProtocol(XAI_DIALECT, SessionSettings(language="yue-HK"))  # Cantonese: no 2-letter code
    with pytest.raises(ValueError, match="en-IN or en-US: give one"):
        GeminiConfig.from_settings(SessionSettings(language="en"))
    with pytest.raises(ValueError, match="de-AT"):
        GeminiConfig.from_settings(SessionSettings(language="de-AT"))
    assert gemini_language_code("PT-br") == "pt-BR" and iso639_1("en-GB") == "en"
    assert speak_line("haw") == "Speak the language haw (BCP 47)."


ROUTES = """
[defaults]
provider = "echo"
language = "en"
[providers.gemini-live]
key_env = "G_KEY"
[[routes]]
name = "berlin"
number = "100"
language = "de-DE"
[[routes]]
name = "wien"
number = "200"
provider = "gemini-live"
language = "{wien}"
[[routes]]
name = "the-rest"
"""


def _config(tmp_path: Path, wien: str) -> Any:
    path = tmp_path / "bridge.toml"
    path.write_text(ROUTES.format(wien=wien))
    return load(path)


def test_serve_refuses_to_start_with_a_language_its_routes_provider_cannot_carry(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        server_config(_config(tmp_path, "de-AT"), {"G_KEY": "k"})
    assert "routes[1].language" in str(refused.value) and "de-AT" in str(refused.value)
    server_config(_config(tmp_path, "de-DE"), {"G_KEY": "k"})  # the listed code starts


def test_the_routes_language_reaches_the_session_settings_and_survives_a_recovery(tmp_path: Path) -> None:
    app = RoutedApplication(Application(), _config(tmp_path, "de-DE"))

    def setup(called: str) -> CallSetup:
        identity = CallIdentity("c1", "sip-c1", "sip:a@x", f"sip:{called}@b", called, "127.0.0.1:5060")
        result: CallSetup = asyncio.run(app.setup(identity))
        return result

    settings = _settings(ServerConfig(), setup("100"))
    assert settings.language == "de-DE"
    assert _settings(ServerConfig(), setup("300")).language == "en"  # a route without one: [defaults]
    seeded = seeded_settings(settings, RecoverySnapshot(caller_text=()), notice=True)
    assert seeded.language == "de-DE"  # HR7: a recovery's connection speaks the call's language too
