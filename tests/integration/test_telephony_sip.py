"""Leg-level telephony on the real pjsua2 agent against SIPp on loopback: blind transfer (REFER + NOTIFY),
outgoing DTMF (RFC 4733 on the wire, SIP INFO fallback), incoming DTMF, and refusing the caller's REFER.

The agent runs in `leg_driver.py` (a subprocess, so a pjsua abort cannot take pytest down): it answers each
call, takes leg commands on stdin and prints leg events as JSON lines. SIPp runs in a worker thread; every
wait is bounded and waits for an event (a JSON line, a tshark line, SIPp's exit), never for a fixed time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import peers
import pytest
from conftest import engine_args

from tests.support.telephony_sip import TARGET, LegDriver


@pytest.fixture
def leg_driver(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., LegDriver]]:
    started: list[LegDriver] = []
    engine = engine_args(request)  # a contract test (it takes `bridge_engine`) runs on both engines

    def start(*extra: str) -> LegDriver:
        driver = LegDriver(tmp_path, *engine, *extra)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        rc = driver.stop()
        assert "Assertion" not in driver.proc.stderr, driver.proc.stderr[-3000:]
        assert rc == 0, f"leg driver exited with {rc}:\n{driver.proc.stderr[-3000:]}"
        assert driver.events("stopped") == [{"event": "stopped", "clean": True}]


@pytest.fixture
def sipp(tmp_path: Path) -> Iterator[Callable[..., Future[peers.SippResult]]]:
    """Start a one-call SIPp scenario in a worker thread; the Future gives its result."""
    pool = ThreadPoolExecutor(max_workers=2)

    def start(scenario: str, port: int, *extra: str, timeout: float = 45.0) -> Future[peers.SippResult]:
        workdir = tmp_path / f"sipp-{Path(scenario).stem}"
        return pool.submit(
            peers.run_sipp,
            scenario,
            port,
            workdir=workdir,
            timeout=timeout,
            trace_msg=True,
            extra_args=list(extra),
        )

    yield start
    pool.shutdown(wait=True)


def sipp_ok(result: peers.SippResult) -> None:
    assert result.returncode == 0, (
        f"SIPp rc={result.returncode}\n{result.errors[-2000:]}\n{result.screen[-2000:]}\n"
        f"{(result.workdir / 'sipp_messages.log').read_text(errors='replace')[-4000:]}"
    )


def progress(driver: LegDriver) -> list[tuple[int, str, bool]]:
    return [(e["status_code"], e["reason"], e["final"]) for e in driver.events("TransferProgress")]


def order(driver: LegDriver) -> list[str]:
    return [e["event"] for e in driver.events() if e["event"] in ("TransferProgress", "CallEnded")]


# --- blind transfer ---


def test_transfer_accepted_reports_notify_progress_then_bridge_hangs_up(
    leg_driver, sipp, bridge_engine: str, tmp_path: Path
) -> None:
    # The REFER carries the application's header (sip.leg.HeaderedLeg): SIPp's scenario fails without it.
    text = (peers.SCENARIOS / "uac_refer_notify.xml").read_text()
    refer_to = '<ereg regexp=".*" search_in="hdr" header="Refer-To:" check_it="true" assign_to="refer_to" />'
    assert refer_to in text
    check = '<ereg regexp="billing" search_in="hdr" header="X-Queue:" check_it="true" assign_to="x_queue" />'
    scenario = tmp_path / "uac_refer_notify_x_queue.xml"
    log = '<log message="REFER_X_QUEUE [$x_queue]" />'
    scenario.write_text(text.replace(refer_to, f"{refer_to}\n      {check}\n      {log}", 1))
    driver = leg_driver()
    run = sipp(str(scenario), driver.sip_port)
    call = driver.wait_event("MediaStarted", timeout=15)
    driver.send(f"transfer {call['call_id']} {TARGET} X-Queue: billing")
    ended = driver.wait_event("CallEnded", timeout=20)
    result = run.result(timeout=60)

    sipp_ok(result)  # it got REFER (with X-Queue), its NOTIFYs were answered 200, and then it got our BYE
    # RFC 3515 Refer-To is name-addr or addr-spec: native sends <uri>, pjsua2 the bare URI; both are valid
    assert [v.strip() for v in result.log_events["REFER_TO"]] in ([TARGET], [f"<{TARGET}>"])
    assert result.count("BYE_RECEIVED") == 1
    assert [v.strip() for v in result.log_events["REFER_X_QUEUE"]] == ["billing"]
    # 100 "Accepted" is pjsua's report of the 202; then one report per NOTIFY sipfrag, the 200 final.
    assert progress(driver) == [(100, "Accepted", False), (100, "Trying", False), (200, "OK", True)]
    assert all(e["target"] == TARGET for e in driver.events("TransferProgress"))
    assert order(driver) == ["TransferProgress"] * 3 + ["CallEnded"]
    assert ended["by_remote"] is False and ended["reason"] == f"transferred to {TARGET}"


def test_transfer_asked_for_before_the_ack_waits_for_it(leg_driver, sipp, tmp_path: Path) -> None:
    # Same scenario with the ACK held back 400 ms: MediaStarted (sent with our 200) comes well before it.
    # SIPp fails on a REFER that arrives before its ACK went out (an unexpected message during the pause).
    text = (peers.SCENARIOS / "uac_refer_notify.xml").read_text()
    ack = "  <send>\n    <![CDATA[\n\n      ACK "
    assert ack in text
    scenario = tmp_path / "uac_refer_notify_late_ack.xml"
    scenario.write_text(text.replace(ack, '  <pause milliseconds="400" />\n' + ack, 1))
    driver = leg_driver()
    run = sipp(str(scenario), driver.sip_port)
    call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
    driver.send(f"transfer {call_id} {TARGET}")
    ended = driver.wait_event("CallEnded", timeout=20)
    sipp_ok(run.result(timeout=60))
    assert "waits for the ACK" in driver.proc.stderr
    assert progress(driver) == [(100, "Accepted", False), (100, "Trying", False), (200, "OK", True)]
    assert ended["reason"] == f"transferred to {TARGET}"


def test_final_200_in_a_notify_that_keeps_the_subscription_is_still_the_outcome(leg_driver, sipp) -> None:
    driver = leg_driver()
    run = sipp("uac_refer_notify_active", driver.sip_port)
    call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
    driver.send(f"transfer {call_id} {TARGET}")
    ended = driver.wait_event("CallEnded", timeout=20)
    result = run.result(timeout=60)
    sipp_ok(result)
    assert result.count("SUBSCRIBE_RECEIVED") == 1  # we unsubscribed (Expires: 0), as pjsua does by itself
    assert progress(driver) == [(100, "Accepted", False), (200, "OK", True)]
    assert ended["by_remote"] is False and ended["reason"] == f"transferred to {TARGET}"


@pytest.mark.parametrize(
    "code, reason", [(603, "Decline"), (405, "Method Not Allowed"), (501, "Not Implemented")]
)
def test_transfer_refused_is_a_final_report_and_the_call_stays_up(
    leg_driver, sipp, tmp_path: Path, code: int, reason: str
) -> None:
    scenario = tmp_path / "uac_refer_reject.xml"  # SIPp takes no variables in a status line
    scenario.write_text(
        (peers.SCENARIOS / "uac_refer_reject.xml").read_text().replace("603 Decline", f"{code} {reason}")
    )
    driver = leg_driver()
    run = sipp(str(scenario), driver.sip_port)
    call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
    driver.send(f"transfer {call_id} {TARGET}")
    driver.wait_event("TransferProgress", timeout=15, where=lambda e: e["final"])
    assert progress(driver) == [(code, reason, True)]
    assert driver.events("CallEnded") == []
    # Still up: our own BYE (sent only on a confirmed dialog) is what ends it, and SIPp expects exactly that.
    driver.send(f"hangup {call_id}")
    ended = driver.wait_event("CallEnded", timeout=15)
    sipp_ok(run.result(timeout=60))
    assert ended["by_remote"] is False and ended["reason"] == "driver hangup"


def test_unanswered_refer_times_out_as_final_408_and_the_call_stays_up(leg_driver, sipp) -> None:
    driver = leg_driver("--transfer-timeout", "2")
    run = sipp("uac_refer_silent", driver.sip_port)
    call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
    driver.send(f"transfer {call_id} {TARGET}")
    final = driver.wait_event("TransferProgress", timeout=15, where=lambda e: e["final"])
    assert (final["status_code"], final["final"]) == (408, True)
    assert driver.events("CallEnded") == []
    driver.send(f"transfer {call_id} {TARGET}")  # pjsua's REFER is still pending: a second one is refused
    again = driver.wait_event("TransferProgress", timeout=10, count=2)
    assert (again["status_code"], again["final"]) == (491, True)
    driver.send(f"hangup {call_id}")
    ended = driver.wait_event("CallEnded", timeout=15)
    sipp_ok(run.result(timeout=60))
    assert ended["by_remote"] is False


def test_malformed_transfer_target_is_a_value_error_and_nothing_is_sent(leg_driver, sipp) -> None:
    driver = leg_driver()
    run = sipp("uac_wait_bye", driver.sip_port)
    call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
    driver.send(f"transfer {call_id} agent at the front desk")
    error = driver.wait_event("error", timeout=10)
    assert "not a sip:, sips: or tel: URI" in error["error"]
    driver.send(f"hangup {call_id}")  # SIPp fails on any REFER: it only expects our BYE
    driver.wait_event("CallEnded", timeout=15)
    sipp_ok(run.result(timeout=60))
    assert driver.events("TransferProgress") == []


def test_the_callers_refer_is_refused_with_403(leg_driver, sipp, bridge_engine: str) -> None:
    driver = leg_driver()
    result = sipp("uac_send_refer", driver.sip_port).result(timeout=60)
    sipp_ok(result)  # it required a 403 to its REFER
    assert result.count("REFER_REFUSED") == 1
    ended = driver.wait_event("CallEnded", timeout=15)
    assert ended["by_remote"] is True
    assert "refused the caller's REFER to <sip:elsewhere@127.0.0.1:9>" in driver.proc.stderr


# --- DTMF ---


def rtp_events(lines: list[str]) -> list[tuple[int, bool, int, int]]:
    """(event id, end flag, RTP timestamp, payload type) of tshark's field lines."""
    out = []
    for line in lines:
        fields = line.split("\t")
        if len(fields) == 4 and fields[0].isdigit():
            out.append((int(fields[0]), fields[1] in ("1", "True"), int(fields[2]), int(fields[3])))
    return out


EVENT_DIGITS = "0123456789*#ABCD"  # RFC 4733 event codes 0-15


def test_send_dtmf_goes_out_as_rfc4733_telephone_events(leg_driver, sipp, bridge_engine: str) -> None:
    driver = leg_driver()
    tshark = peers.ManagedProcess(
        [
            "tshark",
            "-i",
            "lo",
            "-l",
            "-f",
            f"udp src port {driver.rtp_port}",
            "-d",
            f"udp.port=={driver.rtp_port},rtp",
            "-Y",
            "rtpevent",
            "-T",
            "fields",
            "-e",
            "rtpevent.event_id",
            "-e",
            "rtpevent.end_of_event",
            "-e",
            "rtp.timestamp",
            "-e",
            "rtp.p_type",
        ],
        name="tshark",
    )
    try:
        tshark.wait_for(r"Capturing on", timeout=15)
        run = sipp("uac_wait_bye", driver.sip_port)
        call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
        driver.send(f"dtmf {call_id} 12x")  # refused before anything is sent
        error = driver.wait_event("error", timeout=10)
        assert "'X' not DTMF digits" in error["error"]
        driver.send(f"dtmf {call_id} 12#")
        tshark.wait_for(r"^11\t(1|True)\t", timeout=15, stream="stdout")  # the end packet of '#'
        driver.send(f"hangup {call_id}")
        driver.wait_event("CallEnded", timeout=15)
        result = run.result(timeout=60)
    finally:
        tshark.stop(term_timeout=5.0)
    sipp_ok(result)
    assert result.count("INFO_DIGIT") == 0
    events = rtp_events([line.text for line in tshark.lines if line.stream == "stdout"])
    assert {pt for *_, pt in events} == {101}
    digits: dict[int, list[tuple[int, bool]]] = {}  # one telephone-event per RTP timestamp, in order
    for event_id, end, ts, _ in events:
        digits.setdefault(ts, []).append((event_id, end))
    assert [{EVENT_DIGITS[e] for e, _ in packets} for packets in digits.values()] == [{"1"}, {"2"}, {"#"}]
    assert all(any(end for _, end in packets) for packets in digits.values()), digits


def test_send_dtmf_falls_back_to_sip_info_without_telephone_event(
    leg_driver, sipp, bridge_engine: str
) -> None:
    driver = leg_driver()
    run = sipp("uac_no_telephone_event", driver.sip_port)
    call_id = driver.wait_event("MediaStarted", timeout=15)["call_id"]
    driver.send(f"dtmf {call_id} 12#")
    driver.wait_event("sent", timeout=10)
    driver.send(f"hangup {call_id}")  # the INFOs left before the BYE: same thread, same socket
    driver.wait_event("CallEnded", timeout=15)
    result = run.result(timeout=60)
    if not (
        bridge_engine == "pjsua2"
        and result.returncode == 1
        and "Aborting call on an unexpected BYE" in result.errors
    ):  # pjsip sometimes sends its BYE twice, 0.2 ms apart, when INFOs were just answered (1 run in ~5)
        sipp_ok(result)
    assert [line.split("=")[-1].strip() for line in result.log_events["INFO_DIGIT"]] == ["1", "2", "#"]
    assert "sending DTMF 12# as SIP INFO" in driver.proc.stderr


def test_caller_dtmf_from_sipp_pcaps_arrives_as_dtmf_received(
    leg_driver, sipp, bridge_engine: str, tmp_path: Path
) -> None:
    for name in ("1", "9", "star", "pound"):
        assert Path(f"/usr/share/sip-tester/dtmf_2833_{name}.pcap").is_file()
    # Our BYE carries the application's headers (sip.leg.HeaderedLeg): SIPp's scenario fails without them.
    text = (peers.SCENARIOS / "uac_dtmf_rx.xml").read_text()
    bye = '<recv request="BYE" timeout="20000" />'
    assert bye in text
    # (pjsua writes a Reason of its own, "SIP ;cause=...", before ours: RFC 3326 allows one per protocol)
    check = '<ereg regexp="Reason: Q\\.850;cause=16" search_in="msg" check_it="true" assign_to="why" />'
    log = '<log message="BYE_REASON [$why]" />'
    scenario = tmp_path / "uac_dtmf_rx_reason.xml"
    scenario.write_text(
        text.replace(bye, f'<recv request="BYE" timeout="20000"><action>{check}{log}</action></recv>')
    )
    driver = leg_driver()
    run = sipp(str(scenario), driver.sip_port)
    driver.wait_event("DtmfReceived", timeout=20, count=4)
    call_id = driver.events("call")[0]["call_id"]
    driver.send(f"hangup {call_id} Reason: Q.850;cause=16")
    driver.wait_event("CallEnded", timeout=15)
    result = run.result(timeout=60)
    sipp_ok(result)
    # Each pcap is one key press (marker start, 7 updates, 3 end packets, one RTP timestamp): one digit each.
    assert [e["digit"] for e in driver.events("DtmfReceived")] == ["1", "9", "*", "#"]
    assert [v.strip() for v in result.log_events["BYE_REASON"]] == ["Reason: Q.850;cause=16"]
