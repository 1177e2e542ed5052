"""A small application embedding the bridge through its Python API (DL3), for the live tests.

It prints one JSON line per thing it sees (setup, job, dtmf, ended) on stdout, answers `lookup_order` after
`--job-delay` seconds, pushes a fact and an update into the call, and otherwise runs like `serve`.

    python tests/integration/api_app.py --sip 127.0.0.1:5070 --rtp-port 40000 --provider openai-realtime \
        --provider-url ws://127.0.0.1:PORT [--provider-ca FILE] [--job-delay 1.5] [--transfer-target desk=sip:..]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import ssl
import sys

import bridge
from bridge.engine.telephony import TelephonyOptions
from bridge.server.records import CallRecord, CallStarted, Utterance

LOOKUP = bridge.ToolSpec(
    "lookup_order",
    "Look up an order by its number.",
    {"type": "object", "properties": {"order_id": {"type": "string"}}},
)


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


class Shop(bridge.Application):
    def __init__(self, job_delay: float, hangup_on_pound: bool = False) -> None:
        self.job_delay = job_delay
        self.hangup_on_pound = hangup_on_pound
        self.runs = 0

    async def setup(self, call):  # type: ignore[no-untyped-def]
        say(event="setup", called=call.request_user, account=call.header("X-Account"))
        return bridge.CallSetup(
            instructions=f"You answer the {call.request_user} line of the shop.", tools=(LOOKUP,)
        )

    async def job(self, call, job):  # type: ignore[no-untyped-def]
        self.runs += 1
        say(
            event="job", job_id=job.job_id, name=job.name, arguments=json.loads(job.arguments), runs=self.runs
        )
        await asyncio.sleep(self.job_delay)  # backend work; a recovery may happen meanwhile
        output = json.dumps(
            {
                "order_id": json.loads(job.arguments).get("order_id"),
                "status": "shipped",
                "ticket": f"T-{self.runs}",
            }
        )
        call.push_fact(f"order {json.loads(job.arguments).get('order_id')} is shipped")
        say(event="answered", job_id=job.job_id, output=output)
        return output

    async def dtmf(self, call, digit):  # type: ignore[no-untyped-def]
        say(event="dtmf", digit=digit)
        if digit == "#" and self.hangup_on_pound:  # like an IVR: "press pound to finish"
            call.hang_up("the caller finished with #")

    async def ended(self, call, summary):  # type: ignore[no-untyped-def]
        say(event="ended", by=summary.ended_by, reason=summary.reason)

    # The call's events
    async def call_started(self, call, event):  # type: ignore[no-untyped-def]
        assert isinstance(event, CallStarted)
        say(event="call_started", call_id=event.call.call_id, called=event.call.called)

    async def utterance(self, call, utterance):  # type: ignore[no-untyped-def]
        assert isinstance(utterance, Utterance)
        say(event="utterance", interrupted=utterance.interrupted, utterance=utterance.to_json())

    async def call_ended(self, call, record):  # type: ignore[no-untyped-def]
        assert isinstance(record, CallRecord)
        say(event="call_ended", record=record.to_json(), status=call.status()["state"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sip", required=True)
    parser.add_argument("--rtp-port", type=int, required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--provider-url")  # not for --provider echo (the embedded fake)
    parser.add_argument("--provider-ca")
    parser.add_argument("--job-delay", type=float, default=0.0)
    parser.add_argument("--transfer-target", action="append", default=[])
    parser.add_argument("--end-call-tool", action="store_true")
    parser.add_argument("--send-dtmf-tool", action="store_true")
    parser.add_argument("--hangup-on-pound", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    host, port = args.sip.rsplit(":", 1)
    extra = (
        (("ssl_context", ssl.create_default_context(cafile=args.provider_ca)),) if args.provider_ca else ()
    )
    targets = dict(spec.split("=", 1) for spec in args.transfer_target)
    config = bridge.ServerConfig(
        provider=args.provider,
        key="sk-test",
        provider_url=args.provider_url,
        provider_options=extra,
        sip=(host, int(port)),
        rtp_port=args.rtp_port,
        telephony=TelephonyOptions(
            end_call=args.end_call_tool, transfer_targets=targets, send_dtmf=args.send_dtmf_tool
        ),
    )
    return asyncio.run(bridge.Server(Shop(args.job_delay, args.hangup_on_pound), config).run())


if __name__ == "__main__":
    sys.exit(main())
