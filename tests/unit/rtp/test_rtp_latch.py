"""Symmetric RTP source policy: the signalled address, NAT latching, re-latching on a new SSRC after silence;
learning the caller's source (Asterisk's strictrtp), strict mode, and the one-way-audio diagnosis. Virtual time
throughout: every `now` is given, nothing sleeps."""

import logging
from collections import Counter
from typing import Any, cast

import pytest

from rtp.jitter import fast_ulaw_decode
from rtp.latch import SourceLatch, SourcePolicy
from rtp.ledger import CarrierLedger
from rtp.packet import Drop, build
from rtp.playout import Playout
from rtp.rtcp import QoS
from rtp.stream import ARRIVAL_WINDOW_MS, PCMU, RtpStream, StreamConfig
from rtp.units import NS_PER_MS as MS
from sip.core.offer_answer import NegotiatedMedia
from sip.leg import CallIdentity, LegFeatures

SDP = ("192.0.2.10", 4000)
NATTED = ("198.51.100.7", 31000)
OTHER = ("203.0.113.9", 5000)


def test_without_nat_only_the_signalled_address_is_accepted() -> None:
    latch = SourceLatch(SDP, nat=False)
    assert latch.accept(SDP, 1, 0)
    assert not latch.accept(NATTED, 1, MS)
    assert not latch.accept((SDP[0], SDP[1] + 2), 1, 2 * MS)  # same host, other port
    assert latch.refused == 2 and latch.destination == SDP
    # not even after a long silence and a new SSRC
    assert not latch.accept(OTHER, 2, 10_000 * MS)


def test_nat_mode_latches_to_the_first_source_and_sends_there() -> None:
    latch = SourceLatch(SDP, nat=True)
    assert latch.destination == SDP  # nothing received yet: the SDP address
    assert latch.accept(NATTED, 7, 0)
    assert latch.latched == NATTED and latch.destination == NATTED
    assert latch.accept(NATTED, 7, 20 * MS)
    assert not latch.accept(OTHER, 8, 40 * MS)  # a live stream is not taken over
    assert not latch.accept(SDP, 7, 60 * MS)
    assert latch.refused == 2


def test_nat_mode_relatches_only_on_a_new_ssrc_after_silence() -> None:
    latch = SourceLatch(SDP, nat=True, relatch_after_ms=1000)
    latch.accept(NATTED, 7, 0)
    assert not latch.accept(OTHER, 7, 5_000 * MS)  # same SSRC from elsewhere: refused even after silence
    assert not latch.accept(OTHER, 8, 999 * MS)  # new SSRC but the latched source was heard < 1 s ago
    assert latch.accept(OTHER, 8, 1_000 * MS)  # new SSRC, 1 s of silence: a new media server
    assert latch.latched == OTHER and latch.relatches == 1
    assert not latch.accept(NATTED, 7, 1_010 * MS)


def test_resignalling_starts_over() -> None:
    latch = SourceLatch(SDP, nat=False)
    latch.accept(SDP, 1, 0)
    latch.signal(OTHER)
    assert not latch.accept(SDP, 1, MS) and latch.accept(OTHER, 1, 2 * MS) and latch.destination == OTHER


def test_rtcp_is_taken_from_the_media_host() -> None:
    latch = SourceLatch(SDP, nat=True)
    latch.accept(NATTED, 1, 0)
    assert latch.accept_rtcp((NATTED[0], NATTED[1] + 1))
    assert not latch.accept_rtcp(OTHER)


# --- learning the caller's source (Asterisk's strictrtp with learning), strict mode, the diagnosis ---

LAN = ("192.0.2.2", 4000)  # what a softphone's SDP names: its LAN interface
LOOP = ("127.0.0.1", 4000)  # where its packets come from: it dialled the bridge on loopback


def _run(
    latch: SourceLatch, source: tuple[str, int], ssrc: int, seqs: range | list[int], t: int
) -> list[bool]:
    return [latch.accept(source, ssrc, t + i * 20 * MS, seq) for i, seq in enumerate(seqs)]


def test_a_stream_from_another_source_than_signalled_is_learned_after_four_packets_in_sequence() -> None:
    latch = SourceLatch(LAN)  # NAT mode off, the default policy: learn
    assert _run(latch, LOOP, 7, range(100, 106), 0) == [False, False, False, True, True, True]
    assert latch.latched == LOOP and latch.learned == 1 and latch.probation_drops == 3 and latch.refused == 0
    assert (
        latch.destination == LAN
    )  # without --nat we keep sending where the SDP said (Asterisk without comedia)


def test_learning_follows_the_sequence_number_across_its_wrap() -> None:
    latch = SourceLatch(LAN)
    assert _run(latch, LOOP, 7, [65534, 65535, 0, 1], 0) == [False, False, False, True]


def test_a_spoofed_packet_from_a_third_source_during_learning_latches_nothing() -> None:
    latch = SourceLatch(LAN)
    assert not latch.accept(OTHER, 99, 0, 5000)  # one packet alone: a candidate, never taken
    assert latch.latched is None and latch.probation_drops == 1
    # the caller's stream, with a spoofed packet in the middle of its probation run: the run starts over
    assert _run(latch, LOOP, 7, [1, 2], MS) == [False, False]
    assert not latch.accept(OTHER, 7, 3 * MS, 3)  # same SSRC, the next sequence number, wrong source
    assert _run(latch, LOOP, 7, [3, 4, 5], 4 * MS) == [False, False, False]  # 3 in a row: not yet
    assert latch.accept(LOOP, 7, 9 * MS, 6) and latch.latched == LOOP
    # a sequence jump or an SSRC change restarts the run too
    other = SourceLatch(LAN)
    assert _run(other, LOOP, 7, [1, 2, 4, 5, 6], 0) == [False] * 5
    assert _run(other, LOOP, 8, [7], 0) == [False] and other.latched is None


def test_after_latching_other_sources_are_dropped_and_counted() -> None:
    latch = SourceLatch(LAN)
    _run(latch, LOOP, 7, range(1, 5), 0)
    assert latch.latched == LOOP
    assert _run(latch, OTHER, 8, range(500, 510), 100 * MS) == [False] * 10  # a whole sequential stream
    assert latch.refused == 10 and latch.refused_from == OTHER and latch.latched == LOOP
    assert latch.accept(LOOP, 7, 400 * MS, 5)


def test_the_signalled_address_takes_over_from_a_learned_source_and_holds_it() -> None:
    latch = SourceLatch(LAN)
    _run(latch, LOOP, 7, range(1, 5), 0)
    assert latch.accept(LAN, 9, 100 * MS, 1) and latch.latched == LAN and latch.relatches == 1
    assert _run(latch, LOOP, 7, range(5, 15), 120 * MS) == [False] * 10  # strict on the SDP's address now


def test_the_signalled_address_is_taken_at_once_and_then_strict() -> None:
    latch = SourceLatch(LAN)
    assert latch.accept(LAN, 1, 0, 10)
    assert _run(latch, LOOP, 7, range(1, 9), MS) == [False] * 8 and latch.refused == 8


def test_strict_mode_takes_only_the_signalled_address_as_before() -> None:
    latch = SourceLatch(LAN, policy="strict")
    assert _run(latch, LOOP, 7, range(1, 50), 0) == [False] * 49
    assert latch.latched is None and latch.refused == 49 and latch.learned == 0
    assert latch.accept(LAN, 7, 2_000 * MS, 50) and latch.destination == LAN


def test_a_reinvite_to_the_same_address_keeps_the_signalled_latch_and_reopens_a_learned_one_for_5_s() -> None:
    # latched to the signalled address: a re-INVITE (hold, resume, refresh) naming it again changes nothing
    latch = SourceLatch(LAN)
    latch.accept(LAN, 1, 0, 1)
    latch.signal(LAN, 10 * MS)
    assert latch.accept(LAN, 1, 20 * MS, 2)  # no packet lost
    assert _run(latch, LOOP, 7, range(1, 9), 40 * MS) == [False] * 8  # and nobody else learned
    # latched to a learned source: it stays accepted while learning is open again for 5 s
    latch = SourceLatch(LAN)
    _run(latch, LOOP, 7, range(1, 5), 0)
    latch.signal(LAN, 1_000 * MS)
    assert latch.accept(LOOP, 7, 1_020 * MS, 5)
    moved = ("127.0.0.1", 4002)  # the phone resumed from another port
    assert _run(latch, moved, 9, range(1, 5), 1_040 * MS) == [False, False, False, True]
    assert latch.latched == moved and latch.relatches == 1
    # once the window is over the latch is strict again
    latch.signal(LAN, 2_000 * MS)
    assert _run(latch, LOOP, 11, range(1, 9), 7_001 * MS) == [False] * 8 and latch.latched == moved


def test_a_reinvite_to_a_new_address_starts_learning_over() -> None:
    latch = SourceLatch(LAN)
    _run(latch, LOOP, 7, range(1, 5), 0)
    latch.signal(SDP, 1_000 * MS)
    assert not latch.accept(LOOP, 7, 1_020 * MS, 5)  # the old source is a candidate again
    assert latch.accept(SDP, 3, 1_040 * MS, 1) and latch.latched == SDP


# --- the stream core: learned audio reaches the jitter buffer; why nothing did ---


def _stream(policy: SourcePolicy = "learn", nat: bool = False) -> RtpStream:
    config = StreamConfig(
        ssrc=1, initial_seq=0, initial_timestamp=0, cname="t", remote=LAN, nat=nat, source_policy=policy
    )
    return RtpStream(config, lambda: 0.5)


def _voice(k: int) -> bytes:
    return bytes([(k * 7) % 100 + 20]) * 160  # a level per packet: each frame says which packet it was


def _feed(
    stream: RtpStream, source: tuple[str, int], n: int, *, pt: int = PCMU, first: int = 0
) -> list[bytes]:
    """`n` packets of 20 ms from `source`, a slot pulled after each: the PCM of every frame played."""
    out = []
    for k in range(first, first + n):
        now = k * 20 * MS
        stream.receive(build(pt, False, k, 160 * k, 0xA, _voice(k)), source, now)
        frame = stream.pull_frame(now + 10 * MS)
        if frame is not None:
            out.append(frame.pcm)
    return out


def test_a_softphone_whose_sdp_names_its_lan_address_is_heard_from_its_fourth_packet_on() -> None:
    stream = _stream()
    played = _feed(stream, LOOP, 60)
    assert stream.packets_in == 57 and stream.drops[Drop.WRONG_SOURCE] == 3
    voiced = [pcm for pcm in played if any(pcm)]
    assert voiced[:3] == [fast_ulaw_decode(_voice(k)) for k in (3, 4, 5)]  # the caller's own audio, in order
    assert stream.arrival_problem() is None and stream.counters()["source_learned"] == 1


def test_strict_mode_hears_nothing_and_says_the_source_was_refused_naming_both_addresses() -> None:
    stream = _stream("strict")
    assert not any(any(pcm) for pcm in _feed(stream, LOOP, 60))
    problem = stream.arrival_problem()
    assert problem is not None and problem.cause == "source_refused"
    assert "127.0.0.1:4000" in problem.detail and "192.0.2.2:4000" in problem.detail
    assert "--rtp-source strict" in problem.detail and "60 packets" in problem.detail


def test_a_source_that_never_completes_its_probation_run_is_named_with_the_reason() -> None:
    stream = _stream()
    for k in range(10):  # a new SSRC every packet (a broken or hostile sender): never 4 in sequence
        stream.receive(build(PCMU, False, k, 160 * k, k, _voice(k)), LOOP, k * 20 * MS)
    problem = stream.arrival_problem()
    assert problem is not None and problem.cause == "source_refused"
    assert "127.0.0.1:4000" in problem.detail and "never sent 4 packets in sequence" in problem.detail


def test_the_diagnosis_names_srtp_failures_payload_types_malformed_datagrams_or_nothing() -> None:
    stream = _stream()
    problem = stream.arrival_problem(srtp_auth_failures=12)
    assert problem is not None and problem.cause == "srtp_auth" and "12 SRTP packets" in problem.detail
    _feed(stream, LAN, 5, pt=18)  # G.729 where PCMU was negotiated
    problem = stream.arrival_problem()
    assert problem is not None and problem.cause == "payload_type"
    assert "payload type 18" in problem.detail and "negotiated 0" in problem.detail
    garbled = _stream()
    garbled.receive(b"\x00" * 40, LAN, 0)  # version 0
    problem = garbled.arrival_problem()
    assert problem is not None and problem.cause == "malformed"
    silent = _stream().arrival_problem()
    assert silent is not None and silent.cause == "no_rtp" and "192.0.2.2:4000" in silent.detail


def test_the_stream_s_qos_carries_the_one_way_audio_cause_once_the_shell_set_it() -> None:
    stream = _stream("strict")
    assert stream.qos().one_way_audio is None
    stream.one_way_audio = stream.arrival_problem()
    assert stream.qos().one_way_audio == "no_rtp" and stream.qos().as_dict()["one_way_audio"] == "no_rtp"


# --- the shell: one line, the count, the mark (sip/native/leg.py `_CallMedia`), on virtual time ---


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000 * MS

    def __call__(self) -> int:
        return self.now


class _Sockets:
    rtp_fileno = -1

    def send_rtp(self, data: object, destination: tuple[str, int]) -> bool:
        self.last = destination
        return True

    def send_rtcp(self, data: bytes, destination: tuple[str, int]) -> bool:
        return True


class _Leg:
    def __init__(self, clock: _Clock) -> None:
        self.call = "call-7"
        self.sockets = _Sockets()
        self.playout = Playout(CarrierLedger())
        self.agent = type("Agent", (), {"clock": clock, "one_way_audio": Counter()})()
        self.posted: list[object] = []

    def _post(self, event: object) -> None:
        self.posted.append(event)

    def _stream_timer(self, now: int) -> None:
        pass


def _media(
    policy: SourcePolicy, ours: str = "sendrecv", theirs: str = "sendrecv"
) -> tuple[Any, _Leg, _Clock]:
    from sip.native.leg import _CallMedia

    clock = _Clock()
    leg = _Leg(clock)
    negotiated = NegotiatedMedia("PCMU", PCMU, 101, LAN[0], LAN[1], cast(Any, ours), cast(Any, theirs))
    media = _CallMedia(cast(Any, leg), _stream(policy), negotiated)
    media.watch_arrival(clock.now)
    return media, leg, clock


def _slots(media: Any, clock: _Clock, seconds: float, source: tuple[str, int] | None = None) -> None:
    """`seconds` of 20 ms slots; with `source`, a caller packet from there before each."""
    for _ in range(int(seconds * 50)):
        clock.now += 20 * MS
        if source is not None:
            k = media.stream.packets_in + sum(media.stream.drops)
            media.on_rtp(build(PCMU, False, k, 160 * k, 0xA, _voice(k)), source, clock.now)
        media.on_slots(clock.now, 1, 0)


def test_a_call_whose_caller_rtp_is_refused_logs_one_line_why_counts_it_and_marks_its_figures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    media, leg, clock = _media("strict")
    with caplog.at_level(logging.WARNING, logger="parlora.sip"):
        _slots(media, clock, ARRIVAL_WINDOW_MS / 1000 - 0.1, LOOP)
        assert not caplog.records  # not before the window is over
        _slots(media, clock, 10, LOOP)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert lines[0].startswith("call-7: one-way audio (source_refused): no usable RTP from the caller 4 s")
    assert "RTP from 127.0.0.1:4000 refused" in lines[0] and "the SDP named 192.0.2.2:4000" in lines[0]
    assert leg.agent.one_way_audio == Counter({"source_refused": 1})
    assert media.stream.qos().one_way_audio == "source_refused" and media.frames_in == 0


def test_a_learned_call_logs_nothing_and_hands_the_caller_s_frames_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    media, leg, clock = _media("learn")
    with caplog.at_level(logging.WARNING, logger="parlora.sip"):
        _slots(media, clock, 10, LOOP)
    assert not caplog.records and not leg.agent.one_way_audio and media.stream.qos().one_way_audio is None
    assert media.frames_in >= 10 * 50 - 10
    assert leg.sockets.last == LAN  # sent where the SDP said: NAT mode is what sends to the source


def test_a_call_held_from_the_start_is_judged_only_after_it_resumes(caplog: pytest.LogCaptureFixture) -> None:
    media, leg, clock = _media("learn", "sendonly", "recvonly")  # the caller offered recvonly
    with caplog.at_level(logging.WARNING, logger="parlora.sip"):
        _slots(media, clock, 10)
        assert not caplog.records
        media.update(NegotiatedMedia("PCMU", PCMU, 101, LAN[0], LAN[1], "sendrecv", "sendrecv"))
        _slots(media, clock, ARRIVAL_WINDOW_MS / 1000 + 0.1)
    assert [r.getMessage().split(":", 2)[1] for r in caplog.records] == [" one-way audio (no_rtp)"]


def test_the_record_and_the_metric_say_one_way_audio_with_its_cause() -> None:
    from bridge.server.observe import CallObserver
    from bridge.server.records import CallInfo, CallOutcome, RecordBuilder

    info = CallInfo("call-7", "x@h", "<sip:a@h>", "<sip:b@h>", "b", "127.0.0.1", None, "echo")
    builder = RecordBuilder(info, ledger=CarrierLedger(), start_ns=0, started_at=1.0)
    status = {"qos": {"frames_in": 0, "rtp": _stream("strict").qos().as_dict() | {"one_way_audio": "no_rtp"}}}
    _, record = builder.finish(CallOutcome(9.0, "caller", "200 OK", 200, status, 0, 400), 9_000 * MS)
    assert record.one_way_audio == "no_rtp" and record.to_json()["one_way_audio"] == "no_rtp"
    _, fine = RecordBuilder(info, ledger=CarrierLedger(), start_ns=0, started_at=1.0).finish(
        CallOutcome(9.0, "caller", "200 OK", 200, {"qos": {"rtp": _stream().qos().as_dict()}}, 400, 400), 0
    )
    assert fine.one_way_audio is None

    media, _, clock = _media("strict")
    _slots(media, clock, 5, LOOP)
    observer = CallObserver()
    observer.call_ended("main", None, cast(Any, _QosLeg(media.stream)))
    text = observer.metrics.render().decode()
    assert 'parlora_one_way_audio_total{cause="source_refused"} 1.0' in text


class _QosLeg:
    features = LegFeatures(qos=True)
    identity = CallIdentity("call-7", "x@h", "sip:a@h", "sip:b@h", "b", "127.0.0.1")

    def __init__(self, stream: RtpStream) -> None:
        self._stream = stream

    def qos(self) -> QoS | None:
        return self._stream.qos()

    def media_counters(self) -> dict[str, int]:
        return self._stream.counters()


# --- the option: `--rtp-source` and `rtp_source` in a [[trunks]] section reach the engine ---


@pytest.mark.parametrize(
    ("args", "toml", "expected"),
    [
        ([], "", "learn"),  # the default
        (["--rtp-source", "strict"], "", "strict"),
        ([], '[[trunks]]\nname = "pbx"\nrtp_source = "strict"\n', "strict"),
        (
            ["--rtp-source", "learn"],
            '[[trunks]]\nname = "pbx"\nrtp_source = "strict"\n',
            "learn",
        ),  # flag wins
    ],
)
def test_rtp_source_from_the_flag_or_the_file_reaches_the_engine(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, args: list[str], toml: str, expected: str
) -> None:
    from click.testing import CliRunner

    from bridge.cli import commands as cli
    from bridge.server import api

    servers: list[Any] = []
    monkeypatch.setattr(cli, "_run_server", lambda server, loop: servers.append(server) or 0)
    base = ["serve", "--provider", "echo", "--sip", "127.0.0.1:5070"]
    if toml:
        path = tmp_path / "bridge.toml"
        path.write_text('[listeners]\nsip_udp = "127.0.0.1:5070"\n[defaults]\nprovider = "echo"\n' + toml)
        base = ["serve", "--config", str(path)]
    result = CliRunner().invoke(cli.main, [*base, *args])
    assert result.exit_code == 0, result.output
    assert api._engine_config(servers[0].config).rtp_source == expected


def test_an_unknown_rtp_source_is_refused_in_the_file_and_on_the_command_line(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from bridge.cli import commands as cli
    from bridge.cli.config import ConfigError, load

    path = tmp_path / "bridge.toml"
    path.write_text('[[trunks]]\nname = "pbx"\nrtp_source = "loose"\n')
    with pytest.raises(ConfigError, match="rtp_source"):
        load(path)
    result = CliRunner().invoke(cli.main, ["serve", "--rtp-source", "loose"])
    assert result.exit_code == 2 and "--rtp-source" in result.output
