"""AMD's choice in the configuration and over the webhook: [outbound] amd_machine, amd_message,
amd_message_wav and the detector's keys reach the server; an outbound route's choice and message reach its
calls; what cannot be honoured is refused; the webhook's answer to the verdict event chooses."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bridge.cli import ops
from bridge.cli.commands import WebhookApplication
from bridge.cli.config import ConfigError, load
from bridge.cli.ops import RoutedApplication, server_config
from bridge.engine.amd import AmdVerdict
from bridge.server.api import Application
from bridge.server.records import AmdResult
from bridge.server.webhook import WebhookConfig
from sip.leg import CallIdentity
from tests.support.webhook import ENV, App, Received, json_answer

# --- the configuration: [outbound] and the routes --------------------------------------------------------


def _wav(path: Path, samples: int = 800) -> Path:
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\1\0" * samples)
    return path


def _identity(number: str) -> CallIdentity:
    return CallIdentity(
        "call-1", "x@h", "<sip:bridge@h>", f"<sip:{number}@h>", number, "h", direction="outbound"
    )


def test_the_outbound_keys_and_a_routes_choice_reach_the_server_and_the_call(tmp_path: Path) -> None:
    _wav(tmp_path / "left.wav")
    path = tmp_path / "bridge.toml"
    path.write_text(
        '[outbound]\namd = true\namd_machine = "message"\namd_message = "Call us back."\n'
        "amd_total_ms = 5000\namd_machine_greeting_ms = 3000\namd_beep_wait_ms = 20000\namd_decide_ms = 0\n"
        '[[routes]]\nname = "drop"\ndirection = "outbound"\nnumber = "555"\namd_machine = "hang_up"\n'
        '[[routes]]\nname = "wav"\ndirection = "outbound"\nnumber = "556"\namd_message_wav = "left.wav"\n'
    )
    config = load(path)
    server = server_config(config, {})
    assert (server.amd_machine, server.amd_message, server.amd_message_audio, server.amd_decide_ms) == (
        "message",
        "Call us back.",
        None,
        0,
    )
    o = server.amd_options
    assert (o.total_ms, o.machine_greeting_ms, o.beep_wait_ms, o.human_greeting_ms) == (
        5000,
        3000,
        20000,
        1500,
    )
    app = RoutedApplication(Application(), config)
    drop, wav, other = (asyncio.run(app.setup_outbound(_identity(n), None)) for n in ("555", "556", "777"))
    assert (drop.amd_machine, drop.amd_message, drop.amd_message_audio) == ("hang_up", None, None)
    assert (wav.amd_machine, wav.amd_message, wav.amd_message_audio) == (None, None, b"\1\0" * 800)
    assert (other.amd_machine, other.amd_message_audio) == (None, None)  # [outbound]'s (the server's)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '[outbound]\namd = true\namd_machine = "message"\n',
            "outbound.amd_machine: message needs amd_message",
        ),
        (
            '[[routes]]\nname = "r"\ndirection = "outbound"\namd_machine = "message"\n',
            "routes[0].amd_machine: message needs amd_message",
        ),
    ],
)
def test_a_message_with_nothing_to_leave_refuses_to_start(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        server_config(load(path), {})
    assert any(problem in p for p in refused.value.problems), refused.value.problems


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '[[routes]]\nname = "desk"\nnumber = "100"\namd_machine = "hang_up"\n',
            "routes[0].amd_machine: answering",
        ),
        (
            '[outbound]\namd_machine = "voicemail"\n',
            "outbound.amd_machine: expected one of talk, message, hang_up",
        ),
        (
            "[outbound]\namd_machine_greeting_ms = 1000\n",
            "outbound.amd_machine_greeting_ms: expected an integer",
        ),
        ("[outbound]\namd_message_wav = 'nope.wav'\n", "outbound.amd_message_wav: expected an existing file"),
    ],
)
def test_what_amd_cannot_do_is_refused_in_the_file(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load(path)
    assert any(problem in p for p in refused.value.problems), refused.value.problems


# --- the webhook's answer to the verdict ------------------------------------------------------------------


class _Live:
    call_id = "call-9"


@pytest.mark.parametrize(("answer", "action"), [({"output": "hang_up"}, "hang_up"), ({"ok": True}, None)])
async def test_the_webhooks_answer_to_the_verdict_event_chooses(answer: object, action: str | None) -> None:
    app = App(json_answer(answer))
    port = await app.start()
    try:
        hook = WebhookApplication(
            WebhookConfig.from_options(f"http://127.0.0.1:{port}/x", timeout_s=5.0, environ=ENV)
        )
        verdict = AmdVerdict("machine", 0, "a greeting of 2500 ms", 2500, 100, 2500, 2000, 4, 0, 0, 0, 0, 0)
        assert await hook.amd_action(_Live(), verdict, "talk") == action  # type: ignore[arg-type]
        await hook.amd_result(_Live(), AmdResult("call-9", "verdict", "machine", "x", 2500))  # type: ignore[arg-type]
        await hook.amd_result(_Live(), AmdResult("call-9", "beep", "machine", "y", 4000))  # type: ignore[arg-type]
        got: list[Received] = app.requests
        bodies = [json.loads(r.body) for r in got]
        assert [(b["event"], b["kind"]) for b in bodies] == [
            ("amd", "verdict"),
            ("amd", "beep"),
        ]  # verdict once
        assert got[0].headers["idempotency-key"].endswith("/call-9/amd-verdict")
    finally:
        await app.close()


def test_ops_reads_the_route_recording_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _wav(tmp_path / "m.wav")
    path = tmp_path / "bridge.toml"
    path.write_text('[[routes]]\nname = "w"\ndirection = "outbound"\namd_message_wav = "m.wav"\n')
    reads: list[str] = []
    real = ops._read_message
    monkeypatch.setattr(ops, "_read_message", lambda p: reads.append(p) or real(p))
    app = RoutedApplication(Application(), load(path))
    for _ in range(3):
        asyncio.run(app.setup_outbound(_identity("1"), None))
    assert len(reads) == 1
