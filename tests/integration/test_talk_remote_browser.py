"""The console's Talk button from another host: Chromium on one machine, the bridge on another, live.

Two network namespaces stand for two hosts joined by a LAN (a veth pair): the browser's (the outer test's
`unshare --net`, 192.0.2.2 on lan0) and the bridge's (a second `unshare --net` of its own, 192.0.2.1 on lan1,
where nothing else is). The bridge serves its console on `--http 192.0.2.1:PORT`, off loopback, so with a
token, and gives no `--webrtc-address`: its ICE must follow the listener's address. Neither host can reach the
other's loopback, so ICE on 127.0.0.1 (what the bridge did before) cannot connect.

Headless Chromium (a fake microphone playing a spoken WAV) opens http://192.0.2.1:PORT/, is refused until it
signs in with the token (a request without it gets 401), clicks Talk, and hears the echo provider speak its
own utterance back (the remote track's level and inbound bytes); the bridge counts the caller's frames in and
the echo's frames out when the call ends. A page needs a secure context for its microphone: a real
deployment serves the console over HTTPS from another host (docs/console.md); the test marks the bridge's plain-HTTP
origin as secure with Chromium's flag for that.

On the bridge's own host, a stock Chromium (without the flag that makes it offer 127.0.0.1, which
tests/support/browser_channel.py gives) offers its interface addresses only; its checks reach the bridge's loopback
candidate from them, and the call echoes too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import peers
import pytest
from conftest import BRIDGE, _clean_env

from tests.support.browser_channel import chromium, wait_until

INNER = "PARLORA_TALK_NETNS"
BRIDGE_HOST, BROWSER_HOST = "192.0.2.1", "192.0.2.2"
TOKEN = "talk-from-afar-token"
HERE = Path(__file__).resolve().parent


def test_talk_from_another_host_in_network_namespaces() -> None:
    inner = tempfile.mkdtemp(prefix="talk-")  # a short path for the inner run's files
    try:
        peers.rerun_in_netns(HERE / "test_talk_remote_browser.py", INNER, 1, basetemp=inner)
    finally:
        shutil.rmtree(inner, ignore_errors=True)


def _bridge_on_its_own_host(tmp_path: Path, http_port: int) -> peers.ManagedProcess:
    """`serve` in a network namespace of its own, reached over a veth pair from this one."""
    serve = [
        *BRIDGE,
        "serve",
        "--sip",
        f"127.0.0.1:{peers.free_udp_port()}",
        "--rtp-port",
        str(peers.free_rtp_port()),
        "--provider",
        "echo",
        "--http",
        f"{BRIDGE_HOST}:{http_port}",
        "--http-token-env",
        "PARLORA_TALK_TOKEN",
        "--drain-timeout",
        "0",
        "--log-level",
        "info",
    ]
    setup = (
        "ip link set lo up && until ip link show lan1 >/dev/null 2>&1; do sleep 0.05; done && "
        f"ip addr add {BRIDGE_HOST}/24 dev lan1 && ip link set lan1 up && exec "
    )
    bridge = peers.ManagedProcess(
        ["unshare", "--net", "sh", "-c", setup + " ".join(serve)],
        cwd=tmp_path,
        env=_clean_env({"PARLORA_TALK_TOKEN": TOKEN}),
        name="parlora-bridge",
    )
    ours = os.readlink("/proc/self/ns/net")
    wait_until(lambda: os.readlink(f"/proc/{bridge.pid}/ns/net") != ours, 5, "the bridge's own namespace")
    for cmd in (
        f"ip link add lan0 type veth peer name lan1 netns {bridge.pid}",
        f"ip addr add {BROWSER_HOST}/24 dev lan0",
        "ip link set lan0 up",
    ):
        subprocess.run(cmd.split(), check=True, timeout=10)
    bridge.wait_for(rf"console on http://{re.escape(BRIDGE_HOST)}:{http_port}/", timeout=20)
    return bridge


def _talk_stats(driver: Any) -> dict[str, Any]:
    stats: dict[str, Any] = driver.execute_async_script(
        "window.talkStats().then(arguments[arguments.length - 1])"
    )
    return stats


def _microphone(tmp_path: Path) -> tuple[peers.Utterance, Path]:
    """One spoken sentence then 6 s of silence, as Chromium's fake capture wants it (16-bit, 48 kHz)."""
    speech = peers.make_utterance(
        tmp_path / "a.wav",
        "Tell me a long story about the weather in Paris tomorrow morning please.",
        lead_silence_s=0.5,
        tail_silence_s=0.0,
    )
    peers.write_wav(
        tmp_path / "mic8k.wav", np.concatenate([speech.samples, np.zeros(48_000, np.int16)]), 8000
    )
    mic = tmp_path / "mic.wav"
    peers._run_bounded(["sox", "-D", tmp_path / "mic8k.wav", "-r", "48000", "-c", "1", "-b", "16", mic], 20)
    return speech, mic


def _talk_and_hear_the_echo(driver: Any, log: Any, speech: peers.Utterance) -> str:
    """Press Talk on the open console, hear the echo of the microphone's sentence whole, press Stop; the
    call's id. `log` is the bridge's process (`wait_for`)."""
    driver.find_element("id", "talk").click()
    stats = wait_until(
        lambda: (s := _talk_stats(driver))["state"] == "connected" and s, 15, "the WebRTC call to connect"
    )
    call_id = str(stats["callId"])
    assert call_id.startswith("web-"), stats
    log.wait_for(rf"call {call_id} .*caller utterance at \d+ ms", timeout=20)
    heard = wait_until(
        lambda: (s := _talk_stats(driver))["peak"] > 0.05 and s, 15, "the echo to be heard in the page"
    )
    print("the page heard:", heard)
    assert heard["bytesReceived"] > 10_000 and heard["packetsReceived"] > 100, heard
    time.sleep(len(speech.speech) / 8000 + 1.0)  # the echo plays out whole (it lasts what was said)
    driver.find_element("id", "talk").click()  # Stop: the page closes its peer connection
    return call_id


def _frames_both_ways(log: Any, call_id: str, speech: peers.Utterance) -> None:
    """The bridge's count when the call ended: the whole utterance in, its echo out."""
    ended = log.wait_for(rf"call {call_id} ended after .*: frames in (\d+), out (\d+)", timeout=15)
    print(ended.group(0))
    assert int(ended.group(1)) >= len(speech.samples) // 160, ended.group(0)
    assert int(ended.group(2)) >= 0.8 * len(speech.speech) / 160, ended.group(0)


def test_inner_talk_from_another_host_echoes(tmp_path: Path) -> None:
    peers.inner_only(INNER)
    speech, mic = _microphone(tmp_path)
    http_port = 18080
    bridge = _bridge_on_its_own_host(tmp_path, http_port)
    base = f"http://{BRIDGE_HOST}:{http_port}"
    try:
        # ICE follows the listener's address; no STUN server unless configured
        assert f"browser channel: ICE on {BRIDGE_HOST}, no STUN" in bridge.stderr, bridge.stderr[-3000:]
        # the control plane stays locked: from another host, nothing without the token
        request = urllib.request.Request(
            f"{base}/talk",
            data=b'{"type": "offer", "sdp": "v=0"}',
            headers={"content-type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 401

        driver = chromium(
            tmp_path / "profile",
            mic,
            extra=(f"--unsafely-treat-insecure-origin-as-secure={base}",),
            loopback_ice=False,
        )
        try:
            driver.get(base + "/")
            wait_until(lambda: driver.find_element("id", "sign-in").is_displayed(), 10, "the sign-in form")
            driver.find_element("id", "token").send_keys(TOKEN)
            driver.find_element("css selector", "#sign-in button").click()
            wait_until(lambda: driver.find_element("id", "feed-state").text == "live", 10, "the event feed")
            call_id = _talk_and_hear_the_echo(driver, bridge, speech)
        finally:
            driver.quit()
        _frames_both_ways(bridge, call_id, speech)
        # the call came from the browser's host
        assert re.search(
            rf"call {call_id} started: .*\(source {re.escape(BROWSER_HOST)}:\d+\)", bridge.stderr
        )
    finally:
        bridge.stop(term_timeout=15.0)


def test_talk_on_the_bridges_host_from_a_stock_browser(start_bridge: Any, tmp_path: Path) -> None:
    """The bridge on loopback, Chromium beside it without the flag that makes it offer 127.0.0.1: it offers
    its interface addresses only, and its checks reach our loopback candidate from them."""
    if os.environ.get(INNER):
        pytest.skip("the outer run's test")
    speech, mic = _microphone(tmp_path)
    port = peers.free_udp_port(also_tcp=True)
    bridge = start_bridge("--http", f"127.0.0.1:{port}")
    driver = chromium(tmp_path / "profile", mic, loopback_ice=False)
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        wait_until(lambda: driver.find_element("id", "feed-state").text == "live", 10, "the event feed")
        call_id = _talk_and_hear_the_echo(driver, bridge, speech)
    finally:
        driver.quit()
    _frames_both_ways(bridge, call_id, speech)
