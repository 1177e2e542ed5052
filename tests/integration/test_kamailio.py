"""The Kamailio recipe (deploy/kamailio/): its dispatcher in front of two `parlora-bridge serve --engine native`.

Kamailio (Debian's `kamailio` 5.6) runs on loopback from a copy of deploy/kamailio/kamailio.cfg whose
`#!substdef` lines are rewritten (loopback address and ports, 1 s probes, 1 s INVITE timeout), with a
dispatcher.list naming the two bridges and a silent UDP socket (a host that never answers), a private runtime
dir and PID file; it is stopped by that PID. SIPp places the calls through it (scenarios/uac_via_proxy.xml,
which logs the Contact of the bridge that answered each call).

1. Probing: before any call, the silent destination leaves rotation by OPTIONS probing alone.
2. Spread and failover on 503: ten calls at once; bridge A takes at most 2 (`--max-calls 2`), so least-load
   routing gives it two and every later INVITE it gets is answered 503 and failed over to B: all ten are
   answered, by both bridges, none refused.
3. A stopped bridge: A is stopped; new calls sent at once still all succeed, on B, those first tried on A after
   the INVITE timeout (A is then marked inactive, and stays so: its probes go unanswered).
4. Record-Route: the caller's 200 carries the proxy's Record-Route (sip/core/ua.py copies the INVITE's, RFC 3261
   §12.1.1), so in-dialog requests (ACK, BYE) cross the proxy and its load counting sees the call end.
5. 407: `parlora-bridge call` through a Kamailio that challenges INVITEs for proxy authentication
   (its auth module, plain password, no database: AUTH_PROXY) to a SIPp callee behind it: the INVITE is sent
   again with Proxy-Authorization, Kamailio verifies it and relays, the callee answers and hangs up.

Every wait is bounded and waits for a state (a log line, SIPp's exit, the dispatcher's state).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import peers
import pytest
from conftest import BRIDGE, _clean_env

from tests.support.kamailio import NATIVE, Kamailio, _calls, kamailio

__all__ = ["kamailio"]  # the fixture, from the shared harness


@pytest.fixture
def silent_udp() -> Iterator[int]:
    """A UDP port bound and never read: a SIP host that has gone quiet (no answer, no ICMP error)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_kamailio_dispatcher_probes_spreads_and_fails_over(
    start_bridge, kamailio: list[Kamailio], silent_udp: int, tmp_path: Path
) -> None:
    a = start_bridge(*NATIVE, "--max-calls", "2")
    b = start_bridge(*NATIVE)
    proxy = Kamailio(
        tmp_path / "kamailio", [(a.sip_port, "bridge-a"), (b.sip_port, "bridge-b"), (silent_udp, "gone")]
    )
    kamailio.append(proxy)

    # 1. OPTIONS probing alone (no INVITE has been sent yet) takes the silent host out of rotation.
    took = proxy.wait_state(silent_udp, "I", timeout=10)
    states = proxy.states()
    assert states[a.sip_port].startswith("A") and states[b.sip_port].startswith("A"), states
    assert "INVITE" not in proxy.log
    print(f"silent destination inactive after {took:.1f} s of probing; states {states}")

    # 2. Ten calls at once: least load alternates, A is full at 2 and its 503s fail over to B.
    spread, routes = _calls(proxy, tmp_path / "sipp-spread", 10, 3000)
    assert spread == {a.sip_port: 2, b.sip_port: 8}, spread
    # Least load alternates A and B; once A holds its 2 calls it still has the least load, so it is tried
    # first for most later calls, answers 503, and the call fails over to B.
    tried_a = re.findall(rf"INVITE \S+ to sip:127\.0\.0\.1:{a.sip_port}$", proxy.log, re.MULTILINE)
    failovers = re.findall(
        rf"INVITE \S+ failed over to sip:127\.0\.0\.1:{b.sip_port}$", proxy.log, re.MULTILINE
    )
    assert len(failovers) == len(tried_a) - 2 >= 4, proxy.log[-3000:]
    assert f"to sip:127.0.0.1:{silent_udp}" not in proxy.log  # an inactive destination gets no call
    print(f"spread {dict(spread)}; Record-Route seen by the caller: {set(routes)}")

    # 3. A stops; calls placed at once go to B, those tried on A first after the INVITE timeout.
    assert a.stop() == 0
    mark = len(proxy.log)
    moved, _ = _calls(proxy, tmp_path / "sipp-failover", 6, 1000)
    assert moved == {b.sip_port: 6}, moved
    after = proxy.log[mark:]
    assert re.search(
        rf"bridge sip:127\.0\.0\.1:{a.sip_port} did not answer INVITE .*: marked inactive", after
    ), after
    assert proxy.states()[a.sip_port].startswith("I")
    assert proxy.states()[b.sip_port].startswith("A")


def test_kamailio_stays_in_the_dialog_by_record_route(
    start_bridge, kamailio: list[Kamailio], tmp_path: Path
) -> None:
    bridge = start_bridge(*NATIVE)
    proxy = Kamailio(tmp_path / "kamailio", [(bridge.sip_port, "bridge")])
    kamailio.append(proxy)
    proxy.wait_state(bridge.sip_port, "A", timeout=10)
    answered, routes = _calls(proxy, tmp_path / "sipp", 1, 500)
    assert answered == {bridge.sip_port: 1}
    assert len(routes) == 1 and f"<sip:127.0.0.1:{proxy.port};lr" in routes[0], routes


# 407 from a real proxy to `parlora-bridge call`.

# A trunk's edge proxy that challenges INVITEs (auth module: pv_proxy_authenticate with a plain password, no
# database) and relays the authenticated ones to the callee (SIPp uas_answer_bye); logs "AUTHORIZED <user>".
AUTH_PROXY = """#!KAMAILIO
#!substdef "!LB_ADDR!0.0.0.0!g"
#!substdef "!LB_PORT!5060!g"
#!substdef "!DS_LIST_FILE!unused!g"
#!substdef "!CTL_SOCKET!unix:/run/kamailio/kamailio_ctl!g"
#!substdef "!DS_PING_INTERVAL!5!g"
#!substdef "!FR_TIMER_MS!2000!g"
debug=2
log_stderror=yes
children=2
auto_aliases=no
listen=udp:LB_ADDR:LB_PORT
loadmodule "kex.so"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "rr.so"
loadmodule "pv.so"
loadmodule "maxfwd.so"
loadmodule "xlog.so"
loadmodule "siputils.so"
loadmodule "textops.so"
loadmodule "auth.so"
loadmodule "ctl.so"
modparam("ctl", "binrpc", "CTL_SOCKET")
modparam("tm", "fr_timer", FR_TIMER_MS)
modparam("auth", "secret", "parlora-test-nonce-secret")
request_route {
    if (!mf_process_maxfwd_header("10")) { sl_send_reply("483", "Too Many Hops"); exit; }
    if (has_totag()) {
        if (loose_route() || is_method("ACK|BYE")) { t_relay(); }
        exit;
    }
    if (is_method("CANCEL")) { if (t_check_trans()) { t_relay(); } exit; }
    if (is_method("INVITE")) {
        pv_proxy_authenticate("trunk.test", "PASSWORD", "0");  # 0: a plain password (1: HA1)
        $var(rc) = $rc;
        if ($var(rc) < 0 || $au != "USER") {
            xlog("L_INFO", "CHALLENGED $rm $ci (auth $var(rc), user $au)\\n");
            proxy_challenge("trunk.test", "1");
            exit;
        }
        xlog("L_INFO", "AUTHORIZED $au $ci\\n");
        consume_credentials();
        record_route();
    }
    $du = "sip:127.0.0.1:CALLEE_PORT";
    if (!t_relay()) { sl_reply_error(); }
    exit;
}
"""


def test_call_answers_a_407_from_kamailio_and_the_callee_behind_it_answers(
    kamailio: list[Kamailio], tmp_path: Path
) -> None:
    callee_port = peers.free_udp_port()
    media = peers.free_rtp_port()
    callee_log = tmp_path / "callee.log"
    callee = peers.ManagedProcess(
        [
            "sipp", "-sf", str(Path(__file__).parent / "scenarios" / "uas_answer_bye.xml"), "-i", "127.0.0.1",
            "-mi", "127.0.0.1", "-p", str(callee_port), "-mp", str(media), "-m", "1", "-nostdin",
            "-trace_logs", "-log_file", str(callee_log), "-set", "talk_ms", "1500", "-timeout", "30s",
        ],
        cwd=tmp_path,
        name="sipp-callee",
    )  # fmt: skip
    template = AUTH_PROXY.replace("PASSWORD", "pw-acct").replace("USER", "acct")
    proxy = Kamailio(tmp_path / "kamailio", [], template.replace("CALLEE_PORT", str(callee_port)))
    kamailio.append(proxy)
    call = peers.ManagedProcess(
        [*BRIDGE, "call", f"sip:+15550001@127.0.0.1:{proxy.port}", "--auth-user", "acct",
         "--rtp-port", str(peers.free_rtp_port()), "--log-level", "info"],
        cwd=tmp_path,
        env=_clean_env({"PARLORA_SIP_PASSWORD": "pw-acct"}),
        name="parlora-bridge-call",
    )  # fmt: skip
    try:
        assert call.wait(30) == 0, call.stderr[-3000:] + proxy.log[-3000:]
        assert callee.wait(10) is not None
    finally:
        call.stop()
        callee.stop(term_timeout=3.0)
    assert "CHALLENGED INVITE" in proxy.log and "AUTHORIZED acct" in proxy.log, proxy.log[-3000:]
    assert re.search(r"answered \(SIP 200", call.stdout), call.stdout
    text = callee_log.read_text(errors="replace")
    assert "ANSWERED" in text and "HUNGUP" in text, text
