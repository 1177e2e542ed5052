"""The browser channel in a real browser: headless Chromium's Talk button reaches the echo provider.

Chromium (Debian's `chromium` and `chromium-driver`, driven by Selenium; nothing is downloaded) runs with a fake
microphone that plays a spoken WAV (espeak-ng). The page opens a WebRTC call to the bridge (POST /talk, loopback
ICE), the embedded echo provider speaks the utterance back, and the page measures what it receives: the level
of the remote track in a WebAudio AnalyserNode and RTCPeerConnection.getStats() inbound audio bytes. A second
sentence interrupts the echo: the barge-in clears the cushion and no assistant frame leaves after it (the
bridge's log, from the ledger). The call appears in the console's list, and the console's hang-up button ends
it. Bad input: a malformed offer gets a 400 with a reason.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import peers
import pytest

from tests.support.browser_channel import chromium, wait_until


@pytest.fixture
def http_port() -> int:
    return peers.free_udp_port(also_tcp=True)


@pytest.fixture
def browser_profile(tmp_path: Path) -> Iterator[Path]:
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    yield profile


def _post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_talk_button_reaches_the_echo_and_hears_it(
    start_bridge, http_port, browser_profile, tmp_path
) -> None:
    # The microphone says one sentence, waits 1.5 s (the echo of it has started by then), and interrupts.
    first = peers.make_utterance(
        tmp_path / "a.wav",
        "Tell me a long story about the weather in Paris tomorrow morning please.",
        lead_silence_s=0.5,
        tail_silence_s=0.0,
    )
    second = peers.make_utterance(
        tmp_path / "b.wav", "Stop, stop, wait a moment.", lead_silence_s=0.0, tail_silence_s=0.0
    )
    peers.write_wav(
        tmp_path / "mic8k.wav",
        np.concatenate(
            [first.samples, np.zeros(12_000, np.int16), second.samples, np.zeros(48_000, np.int16)]
        ),
        8000,
    )
    mic = tmp_path / "mic.wav"  # Chromium's fake capture wants 16-bit PCM; 48 kHz as a real microphone
    peers._run_bounded(["sox", "-D", tmp_path / "mic8k.wav", "-r", "48000", "-c", "1", "-b", "16", mic], 20)
    bridge = start_bridge("--http", f"127.0.0.1:{http_port}")
    base = f"http://127.0.0.1:{http_port}"

    status, body = _post(f"{base}/talk", b'{"type": "offer", "sdp": "not sdp"}')
    assert status == 400 and "v=0" in body["error"], body  # a malformed offer gets a reason
    status, body = _post(f"{base}/talk", b"{")
    assert status == 400 and body["error"], body

    driver = chromium(browser_profile, mic)
    try:
        driver.get(base + "/")
        wait_until(lambda: driver.find_element("id", "feed-state").text == "live", 10, "the event feed")
        driver.find_element("id", "talk").click()
        stats = wait_until(
            lambda: (
                (
                    s := driver.execute_async_script(
                        "window.talkStats().then(arguments[arguments.length - 1])"
                    )
                )["state"]
                == "connected"
                and s
            ),
            10,
            "the WebRTC call to connect",
        )
        call_id = stats["callId"]
        assert call_id and call_id.startswith("web-"), stats
        assert stats["peak"] < 0.01, stats  # before the caller has finished speaking the bridge sends silence
        # The console lists the browser call (the feed's status snapshot), on the webrtc engine.
        row = wait_until(
            lambda: driver.execute_script(
                "const r = document.querySelector(arguments[0]); return r ? r.textContent : ''",
                f'tr[data-call-id="{call_id}"]',
            ),
            5,
            "the call in the console list",
        )
        assert "webrtc" in row and "browser:console" in row, row
        # The caller's utterance reaches the provider and the echo comes back: the remote track's level rises
        # well above the silence the bridge sends between answers (digital zero through Opus).
        bridge.wait_for(rf"call {call_id} .*caller utterance at \d+ ms", timeout=15)
        heard = wait_until(
            lambda: (
                (
                    s := driver.execute_async_script(
                        "window.talkStats().then(arguments[arguments.length - 1])"
                    )
                )["peak"]
                > 0.05
                and s
            ),
            12,
            "the echo to be heard in the page",
        )
        print("browser channel heard:", heard)
        driver.save_screenshot(str(tmp_path / "console-talk.png"))
        if keep := os.environ.get("PARLORA_ARTEFACTS"):
            shutil.copy(tmp_path / "console-talk.png", keep)
        assert heard["bytesReceived"] > 10_000 and heard["packetsReceived"] > 100, heard
        assert heard["codec"] in ("audio/opus", "audio/PCMU"), heard
        # Barge-in: the second sentence interrupts the echo. The cushion's queued audio is cleared, the ledger
        # says how much of the reply had been handed to the browser, and nothing more leaves after the event.
        barge = bridge.wait_for(
            rf"call {call_id} barge-in \(\w+\) at \d+ ms: cleared (\d+) ms of output; "
            r"heard \[\('out-\d+', (\d+)\)\]; last assistant frame left ([-\d.]+) ms",
            10,
        )
        cleared, heard_ms, last_frame = int(barge.group(1)), int(barge.group(2)), float(barge.group(3))
        assert cleared >= 100 and heard_ms > 0 and last_frame <= 20, barge.group(0)
        # The console's hang-up button on the selected (the only) call: the bridge ends it, the page's peer
        # connection closes, and the call leaves the list.
        assert driver.find_element("id", "detail").get_attribute("data-call-id") == call_id
        driver.find_element("id", "hangup").click()
        wait_until(
            lambda: (
                driver.execute_async_script("window.talkStats().then(arguments[arguments.length - 1])")[
                    "state"
                ]
                in ("closed", "failed", "disconnected")
            ),
            10,
            "the page's peer connection to close after the hang-up",
        )
        wait_until(
            lambda: not driver.find_elements("css selector", f'tr[data-call-id="{call_id}"]'),
            15,
            "the call to leave the console",
        )
    finally:
        driver.quit()
    bridge.wait_for(
        rf"call {call_id} ended after [\d.]+ s by bridge \(hung up from the console\)", timeout=10
    )
