"""Scale-out with Kamailio (deploy/kamailio/): its dispatcher in front of three `parlora-bridge serve`
on loopback, as CI runs it.

1. Spread: 20 calls at once go through the proxy, least-load routing (algorithm 10) spreads them over the three
   bridges; all are answered and closed.
2. Drain under load: with calls live on every bridge, bridge A is drained by `POST /drain` (the same drain as
   SIGTERM). Its live calls finish (the callers hang up, nothing is cut), calls placed meanwhile are answered by
   B and C (an INVITE A gets is answered 503 and failed over), OPTIONS probing takes A out of rotation, and A
   exits 0 once its calls are over.
3. A killed bridge: C is killed (SIGKILL, no goodbye to anyone); new calls still all succeed, on B, those first
   tried on C after the INVITE timeout, and C leaves rotation.

The helpers (Kamailio on a generated loopback copy of the recipe, SIPp through it) are tests/support/kamailio.py's.
Every wait is bounded and waits for a state.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
import urllib.request
from collections import Counter
from pathlib import Path

import peers

from tests.support.kamailio import NATIVE, Kamailio, _calls, kamailio  # noqa: F401 - kamailio is a fixture

CALLS = 20


def _post_drain(port: int) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/drain",
        data=b"",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 202
        body: dict[str, object] = json.loads(response.read())
        return body


def _live_calls(bridge) -> int:
    started = len(re.findall(r"call call-\d+ started", bridge.log))
    ended = len(re.findall(r"call call-\d+ ended after", bridge.log))
    return started - ended


def _wait_live(bridges, total: int, timeout: float) -> list[int]:
    """Wait until the bridges carry `total` live calls between them, every one at least one; their counts."""
    deadline = time.monotonic() + timeout
    while True:
        live = [_live_calls(b) for b in bridges]
        if sum(live) == total and min(live) >= 1:
            return live
        assert time.monotonic() < deadline, live
        time.sleep(0.1)


def test_kamailio_spreads_20_calls_drains_one_bridge_and_survives_a_killed_one(
    start_bridge,
    kamailio: list[Kamailio],  # noqa: F811 - the fixture imported from tests/support/kamailio.py
    tmp_path: Path,
) -> None:
    http_a = peers.free_udp_port(also_tcp=True)
    a = start_bridge(*NATIVE, "--drain-timeout", "30", "--http", f"127.0.0.1:{http_a}")
    b = start_bridge(*NATIVE)
    c = start_bridge(*NATIVE)
    proxy = Kamailio(
        tmp_path / "kamailio", [(a.sip_port, "bridge-a"), (b.sip_port, "bridge-b"), (c.sip_port, "bridge-c")]
    )
    kamailio.append(proxy)
    for bridge in (a, b, c):
        proxy.wait_state(bridge.sip_port, "A", timeout=10)

    # 1. Twenty calls at once: least load gives each bridge its share.
    spread, _ = _calls(proxy, tmp_path / "sipp-spread", CALLS, 3000)
    assert sum(spread.values()) == CALLS and set(spread) == {a.sip_port, b.sip_port, c.sip_port}, spread
    assert min(spread.values()) >= 5, spread  # an even split is 7/7/6
    print(f"spread over three bridges: {dict(spread)}")

    # 2. Drain A under load: its live calls finish, calls placed meanwhile go to B and C.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = pool.submit(_calls, proxy, tmp_path / "sipp-held", 9, 6000)
        live_on_a = _wait_live([a, b, c], 9, timeout=20)[0]  # all nine up, on every bridge
        drained = _post_drain(http_a)
        assert drained["draining"] is True and drained["live_calls"] == live_on_a, drained
        during, _ = _calls(proxy, tmp_path / "sipp-during", 6, 1000)
        kept, _ = held.result(timeout=60)  # _calls asserts every call answered and closed, none rejected
    assert a.sip_port not in during and sum(during.values()) == 6, during
    assert kept[a.sip_port] == live_on_a, (kept, live_on_a)  # A's calls lived on to the caller's BYE
    proxy.wait_state(a.sip_port, "I", timeout=10)  # its probes got 503: out of rotation
    assert a.proc.wait(timeout=30) == 0
    assert "stopping (calls finished; 0 live calls hung up)" in a.log, a.log[-2000:]
    assert not re.search(r"ended after .* by bridge", a.log), a.log[-2000:]  # no call of A was cut

    # 3. Kill C outright: new calls still all succeed, on B; C leaves rotation.
    c.proc.proc.kill()  # the process this test started, by its handle
    c.proc.wait(timeout=10)
    mark = len(proxy.log)
    after: Counter[int]
    after, _ = _calls(proxy, tmp_path / "sipp-after-kill", 6, 1000)
    assert after == {b.sip_port: 6}, after
    # C leaves rotation: at its first unanswered INVITE (marked inactive at once) or by its failed probes.
    proxy.wait_state(c.sip_port, "I", timeout=10)
    timed_out = re.findall(rf"bridge sip:127\.0\.0\.1:{c.sip_port} did not answer INVITE", proxy.log[mark:])
    print(f"after the kill: {dict(after)}; INVITEs that timed out on C: {len(timed_out)}")
    assert proxy.states()[b.sip_port].startswith("A")
