"""A softphone whose SDP names its LAN address while its RTP comes from loopback (rtp/latch.py), live.

The situation of README's own example on a machine with a LAN interface: baresip dials the bridge on
127.0.0.1, names its interface address in its SDP (`c=IN IP4 192.0.2.2`) and sends its RTP from 127.0.0.1
(the route to the bridge). Reproduced faithfully in a private network namespace (`unshare --net`) that has
`lo` and a LAN interface `lan0` with 192.0.2.2/24 (one end of a veth pair): baresip is told `net_interface lan0`, exactly what it
picks by itself on such a machine, and the bridge listens on loopback as in the README.

The outer test re-runs this module inside the namespace (the environment variable below marks the inner run);
the inner tests start the bridge and baresip with the ordinary fixtures:
- learned (the default) and with `--nat`: the call echoes — the bridge took the caller's frames (frames in > 0)
  and baresip heard its own utterance back (correlation, eighth by eighth); no one-way-audio line;
- `--rtp-source strict` (the behaviour before learning): frames in 0 and the one line saying why, naming both
  addresses. Nothing asserts when anything arrived.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import peers
import pytest

INNER = "PARLORA_LATCH_NETNS"
LAN = "192.0.2.2"
HERE = Path(__file__).resolve().parent


def _frames(log: str) -> tuple[int, int]:
    match = re.search(r"call call-1 ended after .*: frames in (\d+), out (\d+)", log)
    assert match, log[-3000:]
    return int(match.group(1)), int(match.group(2))


def test_a_softphone_naming_its_lan_address_in_sdp_is_heard_in_a_network_namespace() -> None:
    # a short path: under pytest's nested tmp_path (about 100 characters to baresip's snd_path) baresip's
    # recordings came out empty every time; under /tmp/latch-XXXX they are written
    inner = tempfile.mkdtemp(prefix="latch-")
    setup = (
        "ip link add lan0 type veth peer name lan1 && ip addr add 192.0.2.2/24 dev lan0 && "
        "ip link set lan1 up && ip link set lan0 up"
    )
    try:
        peers.rerun_in_netns(HERE / "test_media_latch_live.py", INNER, 3, setup=setup, basetemp=inner)
    finally:
        shutil.rmtree(inner, ignore_errors=True)


def _inner() -> None:
    peers.inner_only(INNER)


def _call(start_bridge, utterance, tmp_path: Path, *args: str):  # type: ignore[no-untyped-def]
    bridge = start_bridge("--provider", "echo", *args)
    with peers.BaresipCaller(
        tmp_path / "baresip", utterance.path, extra_config={"net_interface": "lan0"}
    ) as caller:
        result = caller.run(bridge.sip_port, timeout=40)
    assert result.established, result.stdout[-2000:]
    bridge.wait_for(r"call call-1 ended after")
    # the SDP named the LAN address; the packets came from loopback (the only route to the bridge's address)
    assert re.search(rf"call-1 media: PCMU/8000 to {re.escape(LAN)}:\d+ from 127\.0\.0\.1:", bridge.log)
    return bridge, result


@pytest.mark.parametrize("nat", [False, True], ids=["learned", "nat"])
def test_inner_the_call_echoes(start_bridge, utterance, tmp_path: Path, nat: bool) -> None:  # type: ignore[no-untyped-def]
    _inner()
    bridge, result = _call(start_bridge, utterance, tmp_path, *(["--nat"] if nat else []))
    frames_in, frames_out = _frames(bridge.log)
    assert frames_in >= len(utterance.samples) // 160 - 10, bridge.log[-3000:]
    assert frames_out >= len(utterance.speech) // 160
    pieces = peers.heard_in_pieces(utterance.speech, result.received, pieces=8)
    print(
        f"nat={nat}: frames in {frames_in}, out {frames_out}; echo by eighths {[round(p, 3) for p, _ in pieces]}"
    )
    assert sum(peak >= 0.99 for peak, _ in pieces) >= 7 and min(p for p, _ in pieces) >= 0.7
    assert "one-way audio" not in bridge.log


def test_inner_strict_hears_nothing_and_says_why_once(start_bridge, utterance, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _inner()
    bridge, _ = _call(start_bridge, utterance, tmp_path, "--rtp-source", "strict")
    assert _frames(bridge.log)[0] == 0
    lines = re.findall(r"call-1: one-way audio \(([a-z_]+)\): .*", bridge.log)
    assert lines == ["source_refused"], bridge.log[-3000:]
    line = re.search(r"call-1: one-way audio .*", bridge.log)
    assert line and re.search(
        rf"RTP from 127\.0\.0\.1:\d+ refused .* the SDP named {re.escape(LAN)}:\d+", line[0]
    )
