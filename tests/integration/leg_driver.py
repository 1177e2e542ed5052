"""Run a SIP engine on its own and drive its call legs from stdin; print leg events as JSON lines.

The engine comes from `sip.engine`'s registry (`--engine NAME`, default pjsua2), as `serve` gets it.

A stand-in for the session engine in tests of leg-level telephony (transfer, DTMF): no provider, no audio.
Every call is answered at once. Commands, one per line on stdin:

    transfer CALL_ID TARGET     leg.transfer(TARGET)
    transfer CALL_ID TARGET NAME: VALUE   the same, the REFER with that header (sip.leg.HeaderedLeg)
    dtmf CALL_ID DIGITS         leg.send_dtmf(DIGITS)
    hangup CALL_ID              leg.hangup("driver hangup")
    hangup CALL_ID NAME: VALUE  the same, the BYE with that header
    quit                        stop the agent and exit

stdout gets one JSON object per line (after ~6 lines pjlib prints before its log settings apply):
{"event": "listening", "port": N}, {"event": "call", "call_id": ...},
one line per leg event except FrameReceived (the leg event's class name, its fields and "call_id"),
{"event": "sent", ...} when a command was handed to the leg, {"event": "error", ...} when a leg method
raised (e.g. ValueError from send_dtmf), and {"event": "stopped", "clean": bool} last. Logs go to stderr.
The process exits after `--calls` calls ended, on "quit", on stdin EOF or on SIGTERM; exit status 0 when
pjsua stopped cleanly (exit status 2 if it could not start, with the reason on stderr).

    python tests/integration/leg_driver.py --sip 127.0.0.1:5070 --rtp-port 40000 --calls 1 [--engine pjsua2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys
import threading

from sip.engine import DEFAULT_ENGINE, ENGINES, EngineConfig, EngineError, create_engine
from sip.leg import CallLeg, FrameReceived, offers_sip_headers


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sip", default="127.0.0.1:5070", help="HOST:PORT to listen on")
    parser.add_argument("--engine", default=DEFAULT_ENGINE, choices=sorted(ENGINES))
    parser.add_argument("--rtp-port", type=int, default=40000)
    parser.add_argument("--calls", type=int, default=1, help="exit after this many calls ended (0: never)")
    parser.add_argument("--transfer-timeout", type=float, default=30.0)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    host, port = args.sip.rsplit(":", 1)

    loop = asyncio.get_running_loop()
    legs: dict[str, CallLeg] = {}
    done = asyncio.Event()
    ended = 0
    tasks: set[asyncio.Task[None]] = set()

    async def follow(leg: CallLeg) -> None:
        nonlocal ended
        call_id = leg.identity.call_id
        async for event in leg.events():
            if isinstance(event, FrameReceived):
                continue
            fields = dataclasses.asdict(event)
            emit(event=type(event).__name__, call_id=call_id, **fields)
        legs.pop(call_id, None)
        ended += 1
        if args.calls and ended >= args.calls:
            done.set()

    def on_call(leg: CallLeg) -> None:
        legs[leg.identity.call_id] = leg
        emit(event="call", call_id=leg.identity.call_id, from_uri=leg.identity.from_uri)
        leg.answer()
        task = asyncio.create_task(follow(leg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def command(line: str) -> None:
        parts = line.split(maxsplit=2)
        if not parts:
            return
        if parts[0] == "quit":
            done.set()
            return
        verb, call_id, arg = (parts + ["", ""])[:3]
        leg = legs.get(call_id)
        if leg is None:
            emit(event="error", command=line, error=f"no call {call_id!r}")
            return
        try:
            # "NAME: VALUE" after the target (transfer) or the call (hangup): one header for the application's
            target, _, header = arg.partition(" ") if verb == "transfer" else ("", "", arg)
            name, colon, value = header.partition(":")
            headers = ((name.strip(), value.strip()),) if colon and verb in ("transfer", "hangup") else ()
            if headers and not offers_sip_headers(leg):
                raise ValueError(f"the {args.engine} engine's legs take no SIP headers")
            if verb == "transfer" and headers and offers_sip_headers(leg):
                leg.transfer(target, headers)
            elif verb == "transfer":
                leg.transfer(arg)
            elif verb == "dtmf":
                leg.send_dtmf(arg)
            elif verb == "hangup" and headers and offers_sip_headers(leg):
                leg.hangup("driver hangup", headers=headers)
            elif verb == "hangup":
                leg.hangup("driver hangup")
            else:
                raise ValueError(f"unknown command {verb!r}")
        except ValueError as exc:
            emit(event="error", call_id=call_id, command=line, error=str(exc))
            return
        emit(event="sent", call_id=call_id, command=verb, arg=arg)

    def read_stdin() -> None:
        for raw in sys.stdin:
            loop.call_soon_threadsafe(command, raw.strip())
        loop.call_soon_threadsafe(done.set)  # EOF: the test went away

    config = EngineConfig(
        host=host, port=int(port), rtp_port=args.rtp_port, transfer_timeout_s=args.transfer_timeout
    )
    try:
        agent = create_engine(args.engine, config, on_call)
        await agent.start()
    except EngineError as exc:
        print(f"leg driver: cannot start the {args.engine} engine: {exc}", file=sys.stderr, flush=True)
        return 2
    emit(event="listening", port=int(port), engine=args.engine)
    loop.add_signal_handler(signal.SIGTERM, done.set)
    threading.Thread(target=read_stdin, name="stdin", daemon=True).start()
    await done.wait()
    clean = await agent.stop()
    if tasks:
        await asyncio.wait(set(tasks), timeout=5.0)
    emit(event="stopped", clean=clean)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
