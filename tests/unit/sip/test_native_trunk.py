"""The trunk edge on the native engine, on loopback: the inbound policy answers before anything else
(a refused source never becomes a `CallLeg`, so never a provider connection or an application callback), and
its counters show in `sip_status()`.

No sleep is an assertion: every wait is for a datagram or an event, bounded by a timeout."""

from __future__ import annotations

import asyncio

import pytest

from sip.core.auth import AuthAnswer, Credentials, DigestClient
from sip.core.message import Request, Response, make_response, parse, serialize
from sip.engine import EngineConfig
from sip.leg import CallEnded as LegEnded
from sip.leg import CallLeg, MediaStarted
from sip.native.agent import NativeUserAgent
from tests.support.native_shell import can_bind
from tests.support.native_trunk import SDP, WAIT_S, Peer, Registrar, _to_of, engine_factory, invite

__all__ = ["engine_factory"]  # the fixture, from the shared harness


@pytest.mark.skipif(not can_bind("127.0.0.2"), reason="127.0.0.2 is not usable")
async def test_a_source_outside_the_allowlist_gets_403_and_never_a_leg(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(allow=("127.0.0.1/32",))
    assert agent.local is not None
    outsider = Peer("127.0.0.2")
    outsider.sock.sendto(invite(agent.local[1], outsider.address, 1), agent.local)
    answer = await outsider.final()
    assert answer is not None and answer.startswith(b"SIP/2.0 403"), answer
    await asyncio.sleep(0)  # a hand-over would be scheduled with call_soon: let it run if it exists
    assert calls == [] and agent.active_calls == 0
    status = agent.sip_status()
    assert status["policy"]["counters"]["not_allowed"] == 1  # type: ignore[index]
    assert status["policy"]["refused_403"] == 1  # type: ignore[index]
    insider = Peer("127.0.0.1")
    insider.sock.sendto(invite(agent.local[1], insider.address, 2), agent.local)
    ringing = await insider.recv()
    while ringing is not None and ringing.startswith(b"SIP/2.0 100"):
        ringing = await insider.recv()
    assert ringing is not None and ringing.startswith(b"SIP/2.0 180"), ringing
    async with asyncio.timeout(WAIT_S):
        while not calls:
            await asyncio.sleep(0.01)
    assert len(calls) == 1


@pytest.mark.skipif(not can_bind("127.0.0.2"), reason="127.0.0.2 is not usable")
async def test_drop_unknown_sends_nothing(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(allow=("127.0.0.1/32",), drop_unknown=True)
    outsider = Peer("127.0.0.2")
    outsider.sock.sendto(invite(agent.local[1], outsider.address, 1), agent.local)
    assert await outsider.recv(0.5) is None
    assert calls == [] and agent.sip_status()["policy"]["dropped"] == 1  # type: ignore[index]


async def test_a_scanner_user_agent_is_dropped(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory()
    peer = Peer("127.0.0.1")
    peer.sock.sendto(invite(agent.local[1], peer.address, 1, user_agent="friendly-scanner"), agent.local)
    assert await peer.recv(0.5) is None
    assert calls == []
    assert agent.sip_status()["policy"]["counters"]["scanner"] == 1  # type: ignore[index]


async def test_the_per_source_invite_rate_limit_answers_503_with_retry_after(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(invite_rate_per_s=0.5, invite_burst=1)
    peer = Peer("127.0.0.1")
    peer.sock.sendto(invite(agent.local[1], peer.address, 1), agent.local)
    first = await peer.recv()
    assert first is not None and not first.startswith(b"SIP/2.0 503"), first
    while (data := await peer.recv(0.3)) is not None:  # 100/180 of the first call
        assert not data.startswith(b"SIP/2.0 503")
    peer.sock.sendto(invite(agent.local[1], peer.address, 2), agent.local)
    refused = await peer.final()
    assert refused is not None and refused.startswith(b"SIP/2.0 503"), refused
    assert b"Retry-After:" in refused
    assert agent.sip_status()["policy"]["counters"]["rate_limited"] == 1  # type: ignore[index]
    assert len(calls) == 1


async def test_an_options_flood_is_answered_up_to_its_rate_then_dropped_and_counted(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, _calls = await engine_factory(options_rate_per_s=0.5, options_burst=3)
    peer = Peer("127.0.0.1")
    for n in range(8):
        options = invite(agent.local[1], peer.address, 100 + n).replace(b"INVITE", b"OPTIONS")
        peer.sock.sendto(options.split(b"Content-Type")[0] + b"Content-Length: 0\r\n\r\n", agent.local)
    answers = []
    while (data := await peer.recv(0.3)) is not None:
        answers.append(data.split(b"\r\n", 1)[0])
    assert answers == [b"SIP/2.0 200 OK"] * 3, answers  # the burst; the other five got nothing
    status = agent.sip_status()
    assert status["policy"]["counters"] == {"options_rate_limited": 5}, status  # type: ignore[index]
    assert status["counters"]["policy_dropped"] == 5 and status["held"]["calls"] == 0, status  # type: ignore[index]


async def test_inbound_digest_challenges_and_then_accepts(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(inbound_auth=("trunk", "s3cret"))
    peer = Peer("127.0.0.1")
    peer.sock.sendto(invite(agent.local[1], peer.address, 1), agent.local)
    challenge = await peer.final()
    assert challenge is not None and challenge.startswith(b"SIP/2.0 401"), challenge
    assert calls == []
    assert agent.sip_status()["policy"]["challenged"] == 1  # type: ignore[index]
    ack = (  # the 401 ends the INVITE transaction: ACK it (same branch, RFC 3261 17.1.1.3)
        f"ACK sip:bridge@127.0.0.1:{agent.local[1]} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {peer.address[0]}:{peer.address[1]};branch=z9hG4bK-t14-1\r\n"
        f"From: <sip:caller@127.0.0.1>;tag=f1\r\n{_to_of(challenge)}\r\n"
        "Call-ID: t14-1@127.0.0.1\r\nCSeq: 1 ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
    peer.sock.sendto(ack.encode(), agent.local)
    response = parse(challenge)
    assert isinstance(response, Response)
    client = DigestClient(Credentials("trunk", "s3cret"))
    uri = f"sip:bridge@127.0.0.1:{agent.local[1]}"
    answer = client.respond(response, "INVITE", uri)
    assert isinstance(answer, AuthAnswer)
    extra = "".join(f"{name}: {value}\r\n" for name, value in answer.headers)
    peer.sock.sendto(invite(agent.local[1], peer.address, 2, extra=extra), agent.local)
    async with asyncio.timeout(WAIT_S):
        while not calls:
            await asyncio.sleep(0.01)
    assert agent.sip_status()["policy"]["counters"]["auth_ok"] == 1  # type: ignore[index]
    wrong = DigestClient(Credentials("trunk", "guess"))
    bad = wrong.respond(response, "INVITE", uri)
    assert isinstance(bad, AuthAnswer)
    extra = "".join(f"{name}: {value}\r\n" for name, value in bad.headers)
    peer.sock.sendto(invite(agent.local[1], peer.address, 3, extra=extra), agent.local)
    again = await peer.final()
    assert again is not None and again.startswith(b"SIP/2.0 401"), again
    assert len(calls) == 1


# --- registration (RFC 3261 §10) ---


async def test_register_answers_the_digest_challenge_and_unregisters_on_stop(engine_factory) -> None:  # type: ignore[no-untyped-def]
    registrar = Registrar("1001", "pw-1001")
    aor = f"sip:1001@127.0.0.1:{registrar.peer.address[1]}"
    agent, _ = await engine_factory(register=(aor,), register_password="pw-1001", register_expires_s=120)
    first = await registrar.answer_one()
    assert not first.headers.get_fields("Authorization")
    second = await registrar.answer_one()
    assert second.headers.get_fields("Authorization")  # answered the 401
    assert (second.headers.get("Expires") or "") == "120"
    async with asyncio.timeout(WAIT_S):
        while agent.registrations_status()[0]["state"] != "registered":
            await asyncio.sleep(0.01)
    status = agent.sip_status()["registrations"]
    assert isinstance(status, list) and status[0]["aor"] == aor and status[0]["last_error"] is None
    stopping = asyncio.create_task(agent.stop())
    third = await registrar.answer_one()  # the pre-emptive credentials pass at once
    assert (third.headers.get("Expires") or "") == "0"
    assert await stopping
    assert agent.registrations_status() == []


async def test_register_with_a_wrong_password_fails_and_says_why(engine_factory) -> None:  # type: ignore[no-untyped-def]
    registrar = Registrar("1001", "right")
    aor = f"sip:1001@127.0.0.1:{registrar.peer.address[1]}"
    agent, _ = await engine_factory(register=(aor,), register_password="wrong")
    for _ in range(6):  # the first REGISTER, then (bad) credentials on each fresh nonce, until it gives up
        await registrar.answer_one()
        await asyncio.sleep(0.05)  # its answer to our 401 goes out within one loop turn
        if agent.registrations_status()[0]["state"] == "failed":
            break
    assert agent.registrations_status()[0]["state"] == "failed"
    assert len(registrar.seen) >= 2
    status = agent.registrations_status()[0]
    assert status["last_error"] == "bad credentials" or status["last_status"] == 401, status
    assert status["next_attempt_in_s"] is not None


# --- NAT: the external address and symmetric RTP ---


async def _answered(agent: NativeUserAgent, calls: list[CallLeg], peer: Peer, sdp_port: int = 40000) -> bytes:
    """Call from `peer`, answer, and return the 200 OK (bounded waits)."""
    peer.sock.sendto(
        invite(agent.local[1], peer.address, 7).replace(b"40000", str(sdp_port).encode()), agent.local
    )
    async with asyncio.timeout(WAIT_S):
        while not calls:
            await asyncio.sleep(0.01)
    calls[0].answer()
    answer = await peer.final()
    assert answer is not None and answer.startswith(b"SIP/2.0 200"), answer
    return answer


async def test_external_address_is_in_contact_and_sdp(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(external_address="203.0.113.5")
    ok = await _answered(agent, calls, Peer("127.0.0.1"))
    text = ok.decode()
    assert "c=IN IP4 203.0.113.5" in text and "IN IP4 203.0.113.5\r\ns=" in text, text  # c= and o=
    contact = next(line for line in text.split("\r\n") if line.lower().startswith(("contact:", "m:")))
    assert "203.0.113.5" in contact, contact


async def test_nat_mode_sends_rtp_to_where_the_callers_rtp_comes_from(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(nat=True)
    peer = Peer("127.0.0.1")
    rtp = Peer("127.0.0.1")  # the caller's real RTP source: not the port its SDP names (40000)
    ok = await _answered(agent, calls, peer, sdp_port=40000)
    media_port = int(ok.decode().split("m=audio ", 1)[1].split()[0])
    packet = bytes([0x80, 0x00, 0, 1, 0, 0, 0, 160, 0x12, 0x34, 0x56, 0x78]) + b"\xff" * 160
    seen: bytes | None = None
    for n in range(20):  # bounded: a packet every 20 ms until the bridge's RTP comes back to this socket
        rtp.sock.sendto(packet[:2] + (n + 1).to_bytes(2, "big") + packet[4:], ("127.0.0.1", media_port))
        seen = await rtp.recv(0.05)
        if seen is not None:
            break
    assert seen is not None and seen[0] & 0xC0 == 0x80, "no RTP came back to the latched source"
    assert calls[0].media_counters()  # type: ignore[attr-defined]


# --- outbound calls ---


async def _next_event(leg: CallLeg, kinds: tuple[type, ...]) -> object:
    async with asyncio.timeout(WAIT_S):
        async for event in leg.events():
            if isinstance(event, kinds):
                return event
    raise AssertionError("the leg's events ended")


async def _uas_answer(callee: Peer, status: int) -> Request:
    """Answer the INVITE arriving at `callee`: 180, then `status` (200 with an SDP answer)."""
    data = await callee.recv()
    assert data is not None, "no INVITE came"
    request = parse(data)
    assert isinstance(request, Request) and request.method == "INVITE", data
    via = (request.headers.get("Via") or "").split()[1].split(";")[0]
    host, _, port = via.rpartition(":")
    back = (host, int(port))
    callee.sock.sendto(serialize(make_response(request, 180, to_tag="uas1")), back)
    body = SDP.replace("40000", "40010").encode() if status == 200 else b""
    extra = (("Contact", f"<sip:callee@{callee.address[0]}:{callee.address[1]}>"),)
    if body:
        extra += (("Content-Type", "application/sdp"),)
    callee.sock.sendto(
        serialize(make_response(request, status, to_tag="uas1", headers=extra, body=body)), back
    )
    return request


async def test_dial_an_answering_callee_starts_the_media(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, _ = await engine_factory()
    callee = Peer("127.0.0.1")
    leg = await agent.dial(f"sip:callee@127.0.0.1:{callee.address[1]}")
    invite_request = await _uas_answer(callee, 200)
    assert b"m=audio" in invite_request.body
    ack = await callee.recv()
    assert ack is not None and ack.startswith(b"ACK "), ack
    started = await _next_event(leg, (MediaStarted, LegEnded))
    assert isinstance(started, MediaStarted), started
    assert leg.progress == [180]  # type: ignore[attr-defined]
    leg.hangup("test over")
    bye = await callee.recv()
    assert bye is not None and bye.startswith(b"BYE "), bye


async def test_dial_a_busy_callee_ends_with_486(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, _ = await engine_factory()
    callee = Peer("127.0.0.1")
    leg = await agent.dial(f"sip:callee@127.0.0.1:{callee.address[1]}")
    await _uas_answer(callee, 486)
    ended = await _next_event(leg, (LegEnded,))
    assert isinstance(ended, LegEnded) and ended.status_code == 486, ended
    assert agent.active_calls == 0


async def test_dial_keeps_sdes_keys_off_a_call_that_is_not_over_tls(engine_factory) -> None:  # type: ignore[no-untyped-def]
    # Outbound SRTP follows the inbound rule, keys only over TLS (sip.native.tls.sdes_policy)
    agent, _ = await engine_factory(srtp="optional")
    callee = Peer("127.0.0.1")
    leg = await agent.dial(f"sip:callee@127.0.0.1:{callee.address[1]}")
    request = parse(await callee.recv() or b"")
    assert isinstance(request, Request) and request.method == "INVITE"
    assert b"a=crypto" not in request.body and b"RTP/AVP" in request.body  # offer over UDP: plain RTP
    leg.hangup("test over")
    strict, _ = await engine_factory(srtp="required")
    with pytest.raises(ValueError, match="cannot carry SRTP keys"):
        await strict.dial(f"sip:callee@127.0.0.1:{callee.address[1]}")
    assert strict.active_calls == 0 and strict.counts()["rtp_ports"] == 0  # refused before anything was taken


# --- call limits ---


def _ack_for(ok: bytes, port: int, peer: Peer) -> bytes:
    return (
        f"ACK sip:bridge@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {peer.address[0]}:{peer.address[1]};branch=z9hG4bK-ack-{peer.address[1]}\r\n"
        f"From: <sip:caller@127.0.0.1>;tag=f7\r\n{_to_of(ok)}\r\n"
        "Call-ID: t14-7@127.0.0.1\r\nCSeq: 1 ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    ).encode()


async def _bye_within(peer: Peer, seconds: float) -> bytes | None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        data = await peer.recv(left)
        if data is not None and data.startswith(b"BYE "):
            return data
    return None


async def test_rtp_timeout_ends_a_silent_call_with_bye(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(rtp_timeout_s=1.0)
    peer = Peer("127.0.0.1")
    ok = await _answered(agent, calls, peer)
    peer.sock.sendto(_ack_for(ok, agent.local[1], peer), agent.local)
    started = asyncio.get_running_loop().time()
    bye = await _bye_within(peer, 3.0)  # the caller sends no RTP at all: a lost BYE, as far as we know
    assert bye is not None, "no BYE after --rtp-timeout"
    assert asyncio.get_running_loop().time() - started >= 0.9
    assert agent.sip_status()["limit_hangups"] == {"rtp_timeout": 1}


async def test_max_call_duration_ends_a_live_call_with_bye(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(max_call_duration_s=1.0, rtp_timeout_s=30.0)
    peer = Peer("127.0.0.1")
    ok = await _answered(agent, calls, peer)
    peer.sock.sendto(_ack_for(ok, agent.local[1], peer), agent.local)
    bye = await _bye_within(peer, 3.0)
    assert bye is not None, "no BYE after --max-call-duration"
    assert agent.sip_status()["limit_hangups"] == {"max_call_duration": 1}


async def test_max_call_duration_asks_for_a_goodbye_first_then_the_backstop_byes(engine_factory) -> None:  # type: ignore[no-untyped-def]
    # sip.leg.TimeLimitedLeg: the session is told (it lets the model say goodbye, then hangs up);
    # a session that never hangs up gets the engine's BYE `grace_s` later
    from sip.leg import offers_time_limit

    agent, calls = await engine_factory(max_call_duration_s=1.0, rtp_timeout_s=30.0)
    peer = Peer("127.0.0.1")
    ok = await _answered(agent, calls, peer)
    told: list[tuple[float, str]] = []
    leg = calls[0]
    assert offers_time_limit(leg)
    loop = asyncio.get_running_loop()
    leg.on_time_limit(lambda reason: told.append((loop.time(), reason)), 0.8)
    peer.sock.sendto(_ack_for(ok, agent.local[1], peer), agent.local)
    bye = await _bye_within(peer, 4.0)
    assert bye is not None, "no backstop BYE"
    [(at, reason)] = told
    assert reason == "the call reached --max-call-duration (1 s)"
    assert loop.time() - at >= 0.7  # the BYE waited for the goodbye's grace
    assert agent.sip_status()["limit_hangups"] == {"max_call_duration": 1}


async def test_max_call_duration_bye_from_the_goodbye_cancels_the_backstop(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(max_call_duration_s=1.0, rtp_timeout_s=30.0)
    peer = Peer("127.0.0.1")
    ok = await _answered(agent, calls, peer)
    leg = calls[0]
    leg.on_time_limit(lambda reason: leg.hangup(f"goodbye said: {reason}"), 0.5)  # type: ignore[attr-defined]
    peer.sock.sendto(_ack_for(ok, agent.local[1], peer), agent.local)
    bye = await _bye_within(peer, 3.0)
    assert bye is not None
    peer.sock.sendto(_ok_for(bye), agent.local)
    assert await _bye_within(peer, 1.0) is None  # the backstop was cancelled: no second BYE


def _ok_for(request: bytes) -> bytes:
    parsed = parse(request)
    assert isinstance(parsed, Request)
    return serialize(make_response(parsed, 200))


async def test_without_limits_a_silent_call_stays_up(engine_factory) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory()
    peer = Peer("127.0.0.1")
    ok = await _answered(agent, calls, peer)
    peer.sock.sendto(_ack_for(ok, agent.local[1], peer), agent.local)
    assert await _bye_within(peer, 1.5) is None
    assert agent.active_calls == 1


def _reinvite(ok: bytes, port: int, peer: Peer, cseq: int, direction: str) -> bytes:
    """The caller's re-INVITE in the dialog of `ok`: a=sendonly holds the call, a=sendrecv resumes it."""
    body = SDP.replace("1 1 IN", f"1 {cseq} IN") + f"a={direction}\r\n"
    return (
        f"INVITE sip:bridge@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {peer.address[0]}:{peer.address[1]};branch=z9hG4bK-re-{cseq}\r\n"
        f"From: <sip:caller@127.0.0.1>;tag=f7\r\n{_to_of(ok)}\r\n"
        f"Call-ID: t14-7@127.0.0.1\r\nCSeq: {cseq} INVITE\r\nMax-Forwards: 70\r\n"
        f"Contact: <sip:caller@{peer.address[0]}:{peer.address[1]}>\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


async def _reinvited(agent: NativeUserAgent, ok: bytes, peer: Peer, cseq: int, direction: str) -> None:
    peer.sock.sendto(_reinvite(ok, agent.local[1], peer, cseq, direction), agent.local)
    answer = await peer.final()
    assert answer is not None and answer.startswith(b"SIP/2.0 200"), answer
    peer.sock.sendto(
        _ack_for(answer, agent.local[1], peer).replace(b"1 ACK", f"{cseq} ACK".encode()), agent.local
    )


async def test_hold_timeout_ends_a_call_held_too_long_and_the_rtp_timeout_waits_meanwhile(
    engine_factory,
) -> None:  # type: ignore[no-untyped-def]
    agent, calls = await engine_factory(rtp_timeout_s=0.4, hold_timeout_s=1.2)
    peer = Peer("127.0.0.1")
    ok = await _answered(agent, calls, peer)
    peer.sock.sendto(_ack_for(ok, agent.local[1], peer), agent.local)
    await _reinvited(agent, ok, peer, 2, "sendonly")  # on hold at once: no RTP is expected from here
    held_at = asyncio.get_running_loop().time()
    bye = await _bye_within(peer, 3.0)
    assert bye is not None, "no BYE after --hold-timeout"
    assert asyncio.get_running_loop().time() - held_at >= 1.0  # not the RTP timeout's 0.4 s
    assert agent.sip_status()["limit_hangups"] == {"hold_timeout": 1}


async def test_a_call_resumed_after_a_hold_longer_than_the_rtp_timeout_is_not_ended_at_the_resume(
    engine_factory,
) -> None:  # type: ignore[no-untyped-def]
    # The RTP timeout is suspended on hold; at the resume it starts again, or every call held longer than
    # the timeout (a minute, by default) was hung up the moment it came back, before its first packet.
    agent, calls = await engine_factory(rtp_timeout_s=0.8)
    peer = Peer("127.0.0.1")
    ok = await _answered(agent, calls, peer)
    peer.sock.sendto(_ack_for(ok, agent.local[1], peer), agent.local)
    await _reinvited(agent, ok, peer, 2, "sendonly")
    assert await _bye_within(peer, 1.2) is None  # held longer than the RTP timeout: still up
    await _reinvited(agent, ok, peer, 3, "sendrecv")
    resumed_at = asyncio.get_running_loop().time()
    assert await _bye_within(peer, 0.5) is None, "BYE at the resume"
    bye = await _bye_within(peer, 2.0)  # no RTP after the resume either: the timeout, counted from it
    assert bye is not None and asyncio.get_running_loop().time() - resumed_at >= 0.7
    assert agent.sip_status()["limit_hangups"] == {"rtp_timeout": 1}


async def test_a_reinvite_to_another_codec_of_the_clock_changes_what_the_rtp_carries_on_the_same_source(
    engine_factory,
) -> None:  # type: ignore[no-untyped-def]
    # A PBX re-INVITEs a PCMU call to PCMA only (it moved the call to a phone that has only PCMA): the 200
    # answers PCMA and the bridge's RTP turns PCMA (idle 0xD5) on the same SSRC, its sequence going on.
    agent, calls = await engine_factory(nat=True)
    peer, rtp = Peer("127.0.0.1"), Peer("127.0.0.1")
    ok = await _answered(agent, calls, peer)
    peer.sock.sendto(_ack_for(ok, agent.local[1], peer), agent.local)
    media = ("127.0.0.1", int(ok.decode().split("m=audio ", 1)[1].split()[0]))

    async def exchange(pt: int, payload: int, n: int) -> bytes | None:
        """A caller packet of `pt` (so that the bridge latches and sends), and the bridge's next packet."""
        header = bytes([0x80, pt, 0, n, 0, 0, n, 160, 0x12, 0x34, 0x56, 0x78])
        rtp.sock.sendto(header + bytes([payload]) * 160, media)
        return await rtp.recv(0.05)

    first = None
    for n in range(1, 21):  # bounded
        if (first := await exchange(0, 0xFF, n)) is not None:
            break
    assert first is not None and first[1] & 0x7F == 0 and first[12:] == b"\xff" * 160, first
    pcma = _reinvite(ok, agent.local[1], peer, 2, "sendrecv").replace(
        b"RTP/AVP 0\r\na=rtpmap:0 PCMU/8000", b"RTP/AVP 8\r\na=rtpmap:8 PCMA/8000"
    )
    peer.sock.sendto(pcma, agent.local)  # the same length: PCMA for PCMU
    answer = await peer.final()
    assert answer is not None and answer.startswith(b"SIP/2.0 200") and b"RTP/AVP 8" in answer, answer
    last = None
    for n in range(21, 61):  # bounded: until a packet of the new codec comes back
        got = await exchange(8, 0xD5, n)
        if got is not None and got[1] & 0x7F == 8:
            last = got
            break
    assert last is not None, "no PCMA after the re-INVITE"
    assert last[8:12] == first[8:12] and last[12:] == b"\xd5" * 160
    assert int.from_bytes(last[2:4], "big") != int.from_bytes(first[2:4], "big")


# --- serve's bind check ---


def test_check_listen_refuses_an_open_trunk_off_loopback_unless_allow_any() -> None:
    from sip.engine import check_listen

    assert check_listen(EngineConfig(host="127.0.0.1")).ok
    open_trunk = check_listen(EngineConfig(host="0.0.0.0"))
    assert not open_trunk.ok and open_trunk.error is not None and "--allow-any" in open_trunk.error
    assert check_listen(EngineConfig(host="0.0.0.0", allow=("192.0.2.0/24",))).ok
    assert check_listen(EngineConfig(host="0.0.0.0", inbound_auth=("trunk", "pw"))).ok
    warned = check_listen(EngineConfig(host="0.0.0.0"), allow_any=True)
    assert warned.ok and warned.warning is not None and "--allow-any" in warned.warning


def test_the_default_invite_rate_limit_is_off_on_loopback_and_5_per_s_elsewhere() -> None:
    from sip.core.native_plan import invite_rate

    assert invite_rate(EngineConfig(host="127.0.0.1")) == 0.0
    assert invite_rate(EngineConfig(host="0.0.0.0", allow=("192.0.2.0/24",))) == 5.0
    assert invite_rate(EngineConfig(host="0.0.0.0", invite_rate_per_s=20.0)) == 20.0
    assert invite_rate(EngineConfig(host="127.0.0.1", invite_rate_per_s=1.0)) == 1.0


def test_the_default_options_rate_limit_is_off_on_loopback_and_10_per_s_elsewhere() -> None:
    from sip.core.native_plan import options_rate

    assert options_rate(EngineConfig(host="127.0.0.1")) == 0.0
    assert options_rate(EngineConfig(host="0.0.0.0", allow=("192.0.2.0/24",))) == 10.0
    assert options_rate(EngineConfig(host="127.0.0.1", options_rate_per_s=2.0)) == 2.0
