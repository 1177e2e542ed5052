"""Early media's options (bridge/cli/config.py, bridge/cli/ops.py): `[inbound] early_media` / `--early-media`
and an inbound route's `early_media` (off, a tone, a WAV), `[outbound] early_media_to_provider` /
`--early-media-to-provider` and an outbound route's; off by default, each refused where it means nothing,
and refused on the pjsua2 engine."""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path

import pytest

from bridge.cli.config import load
from bridge.cli.ops import RoutedApplication
from bridge.server.api import Application, Server
from sip.leg import CallIdentity
from tests.support.serve_capture import capture_servers, config_file, serve


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Server]:
    """The Server `serve` would run, instead of running it."""
    return capture_servers(monkeypatch)


def identity(called: str, direction: str = "inbound") -> CallIdentity:
    return CallIdentity(
        "c1",
        "sip-c1",
        "sip:a@x",
        f"sip:{called}@y",
        called,
        "127.0.0.1:5000",
        (),
        direction,  # type: ignore[arg-type]
    )


def wav(path: Path, samples: bytes) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(samples)
    return path


def test_both_are_off_by_default_and_on_by_flag_or_file(tmp_path: Path, captured: list[Server]) -> None:
    assert serve([], captured)[0] == 0
    c = captured[0].config
    assert c.early_media is None and c.early_media_to_provider is False
    assert serve(["--early-media", "ringback-us", "--early-media-to-provider"], captured)[0] == 0
    c = captured[0].config
    assert c.early_media == "ringback-us" and c.early_media_to_provider is True
    announcement = wav(tmp_path / "hold.wav", b"\x10\x00" * 800)
    text = f'[inbound]\nearly_media = "{announcement}"\n[outbound]\nearly_media_to_provider = true\n'
    assert serve(["--config", str(config_file(tmp_path, text))], captured)[0] == 0
    c = captured[0].config
    assert c.early_media == b"\x10\x00" * 800 and c.early_media_to_provider is True  # the WAV's samples


def test_a_bad_value_is_refused_and_pjsua2_refuses_either(tmp_path: Path, captured: list[Server]) -> None:
    status, output = serve(["--early-media", "ringbak"], captured)
    assert status == 2 and "--early-media" in output and not captured
    stereo = tmp_path / "stereo.wav"
    with wave.open(str(stereo), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(bytes(800))
    status, output = serve(["--early-media", str(stereo)], captured)
    assert status == 2 and "expected an 8 kHz mono 16-bit PCM WAV" in output
    for flags in (["--early-media", "ringback"], ["--early-media-to-provider"]):
        status, output = serve(["--engine", "pjsua2", *flags], captured)
        assert status == 2 and not captured
        assert "the pjsua2 engine sends no 183 with early media" in output, output


def test_routes_choose_their_own_and_only_in_their_direction(tmp_path: Path, captured: list[Server]) -> None:
    routes = (
        '[inbound]\nearly_media = "ringback"\n'
        '[[routes]]\nname = "desk"\nnumber = "100"\nearly_media = "off"\n'
        '[[routes]]\nname = "us"\nnumber = "101"\nearly_media = "ringback-us"\n'
        '[[routes]]\nname = "rest"\n'
        '[[routes]]\nname = "ivr"\ndirection = "outbound"\nnumber = "555"\nearly_media_to_provider = true\n'
        '[[routes]]\nname = "out"\ndirection = "outbound"\n'
    )
    app = RoutedApplication(Application(), load(config_file(tmp_path, routes)))
    inbound = [asyncio.run(app.setup(identity(n))).early_media for n in ("100", "101", "102")]
    assert inbound == ["off", "ringback-us", None]  # None: the server's [inbound] early_media
    outbound = [
        asyncio.run(app.setup_outbound(identity(n, "outbound"), None)).early_media_to_provider
        for n in ("555", "556")
    ]
    assert outbound == [True, None]
    status, output = serve(["--engine", "pjsua2", "--config", str(config_file(tmp_path, routes))], captured)
    assert status == 2 and "the pjsua2 engine sends no 183" in output
    wrong = (
        '[[routes]]\nname = "a"\nnumber = "1"\nearly_media_to_provider = true\n'
        '[[routes]]\nname = "b"\ndirection = "outbound"\nnumber = "2"\nearly_media = "ringback"\n'
    )
    status, output = serve(["--config", str(config_file(tmp_path, wrong))], captured)
    assert status == 2
    assert "routes[0].early_media_to_provider: the far end's early media is an outbound call's" in output
    assert "routes[1].early_media: an outbound route hears the callee's early media" in output
