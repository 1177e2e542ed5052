"""A small application embedding the bridge through its Python API (DL3), for the live tests.

It prints one JSON line per thing it sees (setup, job, dtmf, ended) on stdout, answers `lookup_order` after
`--job-delay` seconds, pushes a fact and an update into the call, and otherwise runs like `serve`.

    python tests/integration/api_app.py --sip 127.0.0.1:5070 --rtp-port 40000 --provider openai-realtime \
        --provider-url ws://127.0.0.1:PORT [--provider-ca FILE] [--job-delay 1.5] [--transfer-target desk=sip:..]

The call's policies for the live tests of the recording's pauses, the payment-card mode, the no-input timeout
and the budget: `--card` (the model's `collect_card`; the application prints the result, digits and all, as the
one place they go), `--recording-tools`, `--record DIR`, `--cdr FILE`, `--http PORT` (/metrics), a price table
(`--price-input-tokens`, `--price-output-tokens`: the provider's) and per number called `--no-input USER=SECONDS`,
`--budget USER=PRICE` and `--greet USER` (the model speaks first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import ssl
import sys

import bridge
from bridge.engine.card import CardOptions
from bridge.engine.telephony import TelephonyOptions
from bridge.engine.usage import Pricing
from bridge.engine.warm_transfer import WarmOptions
from bridge.server.records import CallRecord, CallStarted, Utterance

LOOKUP = bridge.ToolSpec(
    "lookup_order",
    "Look up an order by its number.",
    {"type": "object", "properties": {"order_id": {"type": "string"}}},
)


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


class Shop(bridge.Application):
    def __init__(
        self,
        job_delay: float,
        hangup_on_pound: bool = False,
        per_number: dict[str, dict] | None = None,
        warm_to: dict[str, str] | None = None,
    ) -> None:
        self.job_delay = job_delay
        self.hangup_on_pound = hangup_on_pound
        self.per_number = per_number or {}  # CallSetup fields by the number called
        self.warm_to = warm_to or {}  # called number -> the URI of a warm transfer asked 1 s into the call
        self.transfers: list[asyncio.Future[None]] = []
        self.runs = 0

    async def setup(self, call):  # type: ignore[no-untyped-def]
        say(event="setup", called=call.request_user, account=call.header("X-Account"))
        return bridge.CallSetup(
            instructions=f"You answer the {call.request_user} line of the shop.",
            tools=(LOOKUP,),
            **self.per_number.get(call.request_user, {}),
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

    async def card_collected(self, call, result):  # type: ignore[no-untyped-def]
        say(event="card", call_id=call.call_id, outcome=result.outcome, digits=result.digits, by=result.by)

    async def ended(self, call, summary):  # type: ignore[no-untyped-def]
        say(event="ended", by=summary.ended_by, reason=summary.reason, call_id=call.call_id)

    # The call's events
    async def call_started(self, call, event):  # type: ignore[no-untyped-def]
        assert isinstance(event, CallStarted)
        say(event="call_started", call_id=event.call.call_id, called=event.call.called)
        if (target := self.warm_to.get(event.call.called)) is not None:
            self.transfers.append(asyncio.ensure_future(self._warm(call, target)))  # (kept: not collected)

    async def _warm(self, call, target: str) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(1.0)
        result = await call.transfer(target, mode="warm", brief="The caller wants a refund for order 42.")
        say(
            event="warm_transfer",
            called=call.info.request_user,
            outcome=result.outcome,
            status=result.status,
            join=result.join,
        )

    async def utterance(self, call, utterance):  # type: ignore[no-untyped-def]
        assert isinstance(utterance, Utterance)
        say(
            event="utterance",
            interrupted=utterance.interrupted,
            utterance=utterance.to_json(),
            call_id=call.call_id,
        )

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
    parser.add_argument("--card", action="store_true")
    parser.add_argument("--recording-tools", action="store_true")
    parser.add_argument("--dtmf-to-model", action="store_true")
    parser.add_argument("--record")
    parser.add_argument("--cdr")
    parser.add_argument("--http", type=int)
    parser.add_argument("--price-input-tokens", type=float, default=0.0)
    parser.add_argument("--price-output-tokens", type=float, default=0.0)
    parser.add_argument("--no-input", action="append", default=[])
    parser.add_argument("--budget", action="append", default=[])
    parser.add_argument("--greet", action="append", default=[])
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--warm-transfer-ring", type=float)  # transfer_call may be warm
    parser.add_argument(
        "--warm-to", action="append", default=[]
    )  # NUMBER=URI: a warm transfer 1 s into its calls
    args = parser.parse_args()
    per_number: dict[str, dict] = {}
    for spec in args.no_input:
        user, seconds = spec.split("=", 1)
        per_number.setdefault(user, {})["no_input_timeout_s"] = float(seconds)
    for spec in args.budget:
        user, price = spec.split("=", 1)
        per_number.setdefault(user, {})["budget"] = float(price)
    for user in args.greet:
        per_number.setdefault(user, {})["greeting"] = "Greet the caller."
    pricing = Pricing(
        input_tokens_per_million=args.price_input_tokens, output_tokens_per_million=args.price_output_tokens
    )
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
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
            end_call=args.end_call_tool,
            transfer_targets=targets,
            send_dtmf=args.send_dtmf_tool,
            dtmf_to_model=args.dtmf_to_model,
            recording_tools=args.recording_tools,
            card=CardOptions() if args.card else None,
            warm=None
            if args.warm_transfer_ring is None
            else WarmOptions(ring_timeout_ms=int(args.warm_transfer_ring * 1000)),
        ),
        record_dir=args.record,
        cdr=args.cdr,
        http=("127.0.0.1", args.http) if args.http else None,
        pricing=((args.provider, pricing),) if args.price_input_tokens or args.price_output_tokens else (),
    )
    warm_to = dict(w.split("=", 1) for w in args.warm_to)
    shop = Shop(args.job_delay, args.hangup_on_pound, per_number, warm_to)
    return asyncio.run(bridge.Server(shop, config).run())


if __name__ == "__main__":
    sys.exit(main())
