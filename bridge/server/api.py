"""Running the bridge inside a Python application (DL3): a `Server` and the `Application` that drives it.

    import asyncio, bridge

    class Shop(bridge.Application):
        async def setup(self, call):                      # per call, from the called number and SIP headers
            return bridge.CallSetup(instructions=f"You answer for line {call.called}.", tools=(LOOKUP,))

        async def job(self, call, job):                   # a tool call or delegation, run exactly once
            call.push_fact(f"order {job.arguments} looked up")
            return '{"status": "shipped"}'

    asyncio.run(bridge.Server(Shop(), bridge.ServerConfig(provider="openai-realtime", key=KEY)).run())

The server answers SIP calls (through the SIP engine named by `ServerConfig.engine`, built by `sip.engine`'s
registry: `bridge` never imports an engine module), runs one session per call against the provider and calls
the application's coroutines; `LiveCall` lets the application push speakable updates, task facts and later
results into a live call. Every method of `Application` has a default, so an application overrides only what
it needs. `parlora-bridge serve` is this server with the command line's options (and the HTTP webhook as its
application when `--webhook` is given).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from bridge.engine.amd import (
    AMD_ACTIONS,
    AmdAction,
    AmdBeep,
    AmdEvent,
    AmdOptions,
    AmdPlan,
    AmdPolicy,
    AmdStart,
    AmdVerdict,
)
from bridge.engine.calling_hours import OutsideCallingHours
from bridge.engine.card import CardOptions, CardResult
from bridge.engine.commands import TransferCall
from bridge.engine.coordinator import CoordinatorOptions
from bridge.engine.delegations import JobRequest
from bridge.engine.dial_limits import DialLimits
from bridge.engine.dial_retry import DialSeries, RetryPolicy
from bridge.engine.disclosure import Disclosure, disclosure_instruction
from bridge.engine.no_input import NoInputOptions
from bridge.engine.rollover import RolloverOptions
from bridge.engine.telephony import (
    TIME_LIMIT_NOTE,
    TelephonyOptions,
    time_limit_grace_s,
    tool_specs,
)
from bridge.engine.usage import Pricing
from bridge.engine.warm_transfer import TransferResult
from bridge.server.console import ConsoleFeed, ConsoleHooks, poll_status
from bridge.server.dial_queue import DialQueue, DialRefused
from bridge.server.dial_series import DoNotCall as DoNotCall  # re-exported: the application raises it
from bridge.server.dial_series import SeriesRun
from bridge.server.dialing import DialTrunk, choose_trunk, dial_target
from bridge.server.drain import ShutdownSignals, drain, http_drain, say_goodbye
from bridge.server.greeting import greet
from bridge.server.http import StatusServer
from bridge.server.idempotency import DialKeys, Dialled
from bridge.server.jsonlog import CALLS as LOG_CALLS
from bridge.server.observe import CallObserver
from bridge.server.plans import ECHO_LOCAL_KEY as ECHO_LOCAL_KEY  # re-exported: the embedded fake's key
from bridge.server.plans import ProviderEndpoint, ProviderPlans
from bridge.server.providers import ProviderChoice
from bridge.server.recording import RecordKeeper
from bridge.server.records import (
    AmdResult,
    AppEvent,
    CallRecord,
    CallStarted,
    DialRow,
    EarlyMediaReport,
    UncertainWork,
    Utterance,
)
from bridge.server.session import CallSession, CallSummary
from bridge.server.warm import WarmDeps
from providers.base import Provider, SessionSettings, ToolSpec
from providers.limits import LimitOverrides
from sip.core.app_headers import DEFAULT_ALLOW
from sip.core.attestation import attestation_of
from sip.core.outbound import check_headers
from sip.core.policy import DEFAULT_SCANNERS
from sip.core.telephony import validate_transfer_target
from sip.core.trunks import Trunk
from sip.engine import (
    DEFAULT_ENGINE,
    EngineConfig,
    EngineError,
    EngineStartError,
    SipEngine,
    check_listen,
    create_engine,
    offers_dial,
    offers_status,
)
from sip.leg import CallIdentity, CallLeg, offers_early_media, offers_sip_headers, offers_time_limit

if TYPE_CHECKING:
    from bridge.server.browser import BrowserChannel

log = logging.getLogger("parlora")
_KEPT_AMD_LINES = 64  # calls whose AMD line `Server.amd_line` keeps after they end


@dataclass(frozen=True, slots=True)
class CallSetup:
    """What one call's sessions are configured with (every connection of the call: rollovers and recoveries
    are seeded from it)."""

    instructions: str | None = None
    voice: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    history: tuple[tuple[str, str], ...] = ()  # (role, text) before the caller speaks
    greeting: str | None = None  # asked of the model as soon as the call is answered (speaks first)
    route: str | None = None  # the config route that chose this setup (logs, metrics)
    provider: str | None = None  # the route's provider (one of ServerConfig.route_providers)
    language: str | None = None  # BCP 47 ("de-DE"): each provider takes it in its own field (SessionSettings)
    amd: bool | None = None  # an outbound call's machine detection (None: ServerConfig.amd)
    # the AI disclosure, the call's first audio: a recording the bridge plays, or a line the model must say first
    # (bridge/engine/disclosure.py); the call record says whether it reached the carrier
    disclosure: Disclosure | None = None
    # After a mailbox verdict (bridge/engine/amd.py): "talk", "message" or "hang_up" (None: ServerConfig.amd_machine),
    # the message the model is told to say, or PCM16 8 kHz mono audio the bridge plays (None: the server's)
    amd_machine: AmdAction | None = None
    amd_message: str | None = None
    amd_message_audio: bytes | None = None
    # an inbound call's early media (None: ServerConfig.early_media): "off", a tone of rtp.tones.RINGBACK_TONES
    # or an announcement (8 kHz mono PCM16), after a 183 while the provider connects (sip/native/early.py)
    early_media: str | bytes | None = None
    # an outbound call's: the far end's early media given to the model too (None: ServerConfig's)
    early_media_to_provider: bool | None = None
    # the recording consent, after the disclosure: a recording the bridge plays or a line the model says first;
    # the recording starts once it was heard whole (bridge/server/recording.py; None: ServerConfig's)
    recording_consent: Disclosure | None = None
    no_input_timeout_s: float | None = None  # the caller's no-input timeout (None: ServerConfig's; 0: off)
    # the call ends with a goodbye (end reason "budget") once its price reaches this (bridge/engine/usage.py)
    budget: float | None = None


class CallRefused(Exception):  # a refusal the application means, not an error
    """Raised by `Application.setup` to refuse the call with a SIP status (e.g. 404: no route for the number)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class LiveCall:
    """The application's handle on one live call."""

    def __init__(self, info: CallIdentity, session: CallSession) -> None:
        self.info = info
        self._session = session

    @property
    def call_id(self) -> str:
        return self.info.call_id

    def status(self) -> dict[str, Any]:
        return self._session.status()

    def push_update(self, text: str, *, speak: bool = True) -> bool:
        """Tell the model something now (spoken when `speak`); held while the voice path is being repaired."""
        return self._session.push_update(text, speak=speak)

    def push_fact(self, text: str) -> None:
        """A task fact or verified result, seeded into any later connection; never spoken by itself."""
        self._session.push_fact(text)

    def push_result(self, job_id: str, output: str) -> bool:
        """A later (revised) result of a job the model asked for."""
        return self._session.push_result(job_id, output)

    def hang_up(
        self,
        reason: str = "ended by the application",
        *,
        headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
    ) -> None:
        """End the call: BYE (a final response before the answer). `headers` go on the BYE (none on a final
        response or a CANCEL): names the SIP stack does not own, values without CR, LF or control characters,
        at most 16, 1,024 bytes a value and 2,048 in all (sip/core/app_headers.py `check_app_headers` says which
        and why); one that breaks those rules, or any on a call that is not SIP (the browser), is a ValueError
        (`HeaderRefused` names the header) and nothing is sent."""
        leg, checked = self._session.leg, self._checked(headers)
        if checked and offers_sip_headers(leg):
            leg.hangup(reason, headers=checked)
        else:
            leg.hangup(reason)

    def transfer(
        self,
        target: str,
        *,
        headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        mode: Literal["cold", "warm"] = "cold",
        brief: str | None = None,
        digits: str = "",
    ) -> asyncio.Future[TransferResult] | None:
        """Cold (blind) transfer by SIP REFER to `target`, a sip:, sips: or tel: URI, the REFER carrying
        `headers` (checked as `hang_up`'s). ValueError for a bad target or header, nothing sent. When the
        transferee reports that the target answered, the bridge hangs up ("transferred to <target>"); any other
        outcome leaves the call up and is logged (sip/leg.py `CallLeg.transfer`). One transfer at a time per
        call: while one (the model's transfer_call or an earlier one of these) awaits its outcome, this raises
        `TransferInProgress` (bridge/engine/telephony.py) and nothing is sent.

        `mode="warm"` (bridge/engine/warm_transfer.py, bridge/server/warm.py): the caller waits on hold while the
        bridge dials `target` (keying `digits` after the answer), a second session briefs the human (`brief`,
        or a summary of the call's last utterances) and the human keys 1 to accept (hanging up or 2 refuses);
        accepted, the bridge relays media between the two legs and the AI leaves; otherwise the caller is back
        with the model, who is told the typed reason. Returns a future of the `TransferResult` (`outcome`,
        the target's SIP `status`); `headers` are not used (ValueError when given)."""
        if mode == "warm":
            if headers:
                raise ValueError("a warm transfer places a call: it carries no REFER headers")
            if digits and set(digits) - set("0123456789*#ABCD"):
                raise ValueError(f"not DTMF digits: {digits!r}")
            return self._session.warm_transfer(validate_transfer_target(target), brief, digits)
        checked = self._checked(headers)
        self._session.transfer(TransferCall(validate_transfer_target(target), checked))
        return None

    def _checked(self, headers: Mapping[str, str] | Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
        checked = check_headers(headers)
        if checked and not offers_sip_headers(self._session.leg):
            raise ValueError(
                f"call {self.call_id}: its leg cannot carry SIP headers (LegFeatures.sip_headers)"
            )
        return checked

    def pause_recording(self) -> bool:
        """Pause the call's recording (`--record`): silence for the gap's real duration in the WAV, the gap in
        the record. False when the call is not recorded or the application's pause is already on."""
        return self._session.pause_recording("application")

    def resume_recording(self) -> bool:
        """End the application's pause (a card collection's own pause goes on until it ends); False when it
        was not on."""
        return self._session.resume_recording("application")

    async def collect_card(
        self,
        *,
        min_digits: int = 12,
        max_digits: int = 19,
        terminator: str = "#",
        digit_timeout_s: float = 10.0,
        timeout_s: float = 90.0,
        reference: str | None = None,
    ) -> CardResult:
        """Payment-card mode (bridge/engine/card.py): the caller keys in digits (RFC 4733) while their audio is
        withheld from the provider and the recording is paused; returns the result (`outcome` "collected",
        "timeout", "invalid", "cancelled", "hangup" or "refused"; `digits` when collected; `reference` as
        given). The digits reach nothing else: not the model, the `dtmf` handler, the record, a log or a
        metric. Have the model prompt the caller first (`push_update`); its voice still plays meanwhile.
        ValueError for a shape that cannot be honoured (bridge/engine/card.py `CardOptions`)."""
        options = CardOptions(
            min_digits,
            max_digits,
            terminator,
            int(digit_timeout_s * 1000),
            int(timeout_s * 1000),
            reference,
        )
        return await self._session.collect_card(options)

    def cancel_card(self) -> bool:
        """End the card collection under way (`cancelled`); False when there is none."""
        return self._session.cancel_card()

    def say_goodbye(self, note: str, reason: str) -> bool:
        """The drain timeout, the time limit or the application's own: the model is asked for a short goodbye
        (`note`), then BYE with `reason` once it has been played (or after the goodbye timeout); False when the
        call is not live (then hang it up). The record's `ended_by` is "bridge" (not the model's choice nor the
        caller's: bridge/engine/telephony.py `CallEnding.by_bridge`; the record has no "application" value),
        its `reason` this `reason`; an empty one is the model's `end_call` and stays "provider"."""
        core = self._session.coordinator
        if core is None or core.ending.ended or not self._session.push_update(note, speak=True):
            return False
        core.ending.end_after_goodbye(self._session.now(), reason)  # on the session's clock, as its core
        return True


class Application:
    """The application side of the bridge. Override what you need; the defaults answer like `serve`."""

    async def setup(self, call: CallIdentity) -> CallSetup:
        """Per call, before it is answered: instructions and tools from the called number and SIP headers."""
        return CallSetup()

    def check_outbound(self, target: str, route: str | None) -> None:
        """Before a call is placed (`Server.dial`), and again before each retry of it: ValueError refuses it
        before anything is sent (`POST /calls` answers 400 with the message), e.g. for a `route` this
        application does not have; `DoNotCall` for a number on a do-not-call list. Each refusal is a CDR row."""
        if route is not None:
            raise ValueError(f"route {route!r}: this application has no routes to name")

    def retry_policy(self, target: str, route: str | None) -> RetryPolicy | None:
        """A placed call's retry policy for busy and no answer (bridge/engine/dial_retry.py); None: the
        server's (`ServerConfig.retry`, `[outbound]`)."""
        return None

    async def setup_outbound(self, call: CallIdentity, route: str | None) -> CallSetup:
        """Per call this bridge placed, while the callee rings (`call.direction == "outbound"`; `route` is the
        one the request named, or None). Default: `setup(call)`."""
        return await self.setup(call)

    async def job(self, call: LiveCall, job: JobRequest) -> str:
        """A tool call or delegation, dispatched once however often the provider delivers it; the returned
        text (JSON or plain) is the model's answer. An exception becomes an error answer for the model."""
        return '{"error": "no application handler is configured for tools"}'

    async def dtmf(self, call: LiveCall, digit: str) -> None:
        """The caller pressed a key (RFC 4733); never a key of a card collection."""

    async def card_collected(self, call: LiveCall, result: CardResult) -> None:
        """A card collection the model started (its `collect_card` tool) ended: the only place its digits go
        (`result.digits` when `result.outcome` is "collected"). The model was told the outcome only."""

    async def ended(self, call: LiveCall, summary: CallSummary) -> None:
        """The call is over."""

    # The call's events, in order (bridge/server/records.py); each handler has 10 s, a failure is logged
    async def call_started(self, call: LiveCall, event: CallStarted) -> None:
        """The call's session begins (before it is answered)."""

    async def utterance(self, call: LiveCall, utterance: Utterance) -> None:
        """A caller or assistant utterance, complete (the assistant's timed by what was transmitted)."""

    async def work_uncertain(self, call: LiveCall, event: UncertainWork) -> None:
        """S8: work whose outcome became uncertain — a result or update sent on a connection lost or closed
        before it acknowledged it (`unknown`), a job still running when the session ended, after a 2 s grace
        (`cut_off`: its handler was cancelled), an answer never given to the model (`not_delivered`) — each
        with its request (job id, tool, arguments). Reconcile before doing it again; never replayed."""

    async def amd_result(self, call: LiveCall, event: AmdResult) -> None:
        """An outbound call's answering-machine detection (`[outbound] amd`): the verdict, then for a machine
        its beep or none. Informational, in the order of the call's events: what follows the verdict is chosen
        by the route (`amd_machine`) or by `amd_action`, which is asked at the verdict itself."""

    async def amd_action(self, call: LiveCall, verdict: AmdVerdict, default: AmdAction) -> AmdAction | None:
        """An outbound call's machine detection decided (`verdict.kind`: human, machine, beep, silence,
        unknown): return the action to take — "talk" (the model speaks), "message" (the route's message after
        the beep, then BYE) or "hang_up" — or None for `default` (the route's: `amd_machine` for a mailbox,
        "talk" for anyone else). Waited for at most `amd_decide_ms` after the verdict (the greeting of a
        person waits meanwhile); a later answer is ignored."""
        return None

    async def early_media(self, call: LiveCall, event: EarlyMediaReport) -> None:
        """The far end's early media on a call this bridge placed (a 183 or 180 with SDP: an IVR, an
        announcement, ringback), when it starts and when it ends (the answer, or a failure after it: then the
        call's record says "early media heard"). Evidence for the application; the model hears it only when
        the route asks (`early_media_to_provider`)."""

    async def call_ended(self, call: LiveCall, record: CallRecord) -> None:
        """The call is over: its record (also the `--cdr` line); called before `ended`."""

    async def approve_rollover(self, call: LiveCall, rollover_id: str) -> bool:
        """Before a rollover opens the next connection (RO6): False or an exception refuses it."""
        return True

    async def authorize(self, connection_id: str) -> bool:
        """Before every provider connection is opened (RO7), keyed by "<call id>/conn-N"."""
        return True


@dataclass(frozen=True, slots=True)
class DialRequest:
    """What a dial asks for; equal requests are what an Idempotency-Key may repeat (bridge/server/idempotency.py)."""

    to: str
    from_uri: str | None
    ring_timeout_s: float | None
    trunk: str | None
    route: str | None
    headers: tuple[tuple[str, str], ...]  # checked (sip/core/outbound.py check_headers)


@dataclass(frozen=True)
class ServerConfig:
    """Where to answer calls and which provider to bridge them to."""

    provider: str = "echo"  # "echo" (the embedded GPT-Live fake) or a name in bridge.server.providers.KINDS
    key: str | None = None  # the provider's API key (never logged)
    provider_url: str | None = None
    provider_options: tuple[tuple[str, Any], ...] = ()  # adapter keyword arguments (e.g. ssl_context)
    sip: tuple[str, int] = ("127.0.0.1", 5060)
    rtp_port: int = 4000
    rtp_port_high: int | None = None  # the RTP range's last port (None: the engine's own pool size)
    sip_tcp: bool = True  # SIP over TCP on the `sip` address too (the native engine)
    max_calls: int | None = None  # None: the engine's default (sip.engine.ENGINES[engine].default_max_calls)
    http: tuple[str, int] | None = None  # GET /calls status endpoint, the console at / and POST /talk
    http_token: str | None = (
        None  # bearer token for the HTTP listener (required off loopback: bridge/cli/commands.py)
    )
    browser_channel: bool = True  # POST /talk: WebRTC calls from the console page (bridge/server/browser.py)
    # The browser channel's ICE (bridge/server/browser.py): candidates on this address instead of the HTTP listener's
    # (a wildcard listener: every interface address); STUN URLs for the bridge and the page, none by default.
    webrtc_address: str | None = None
    stun: tuple[str, ...] = ()
    instructions: str | None = None  # used when the application's setup gives none
    limits: LimitOverrides | None = None
    failure_message: bytes | None = None
    hold_music: bytes | None = (
        None  # PCM16 8 kHz, looped while a caller waits for a warm transfer (None: silence)
    )
    rollover: RolloverOptions | None | str = "default"  # "default": from the provider's cap; None: off
    telephony: TelephonyOptions = field(default_factory=TelephonyOptions)
    engine: str = DEFAULT_ENGINE  # the SIP engine: a name in sip.engine.ENGINES
    # "client": the provider's turn detection off, the engine commits each caller turn (RO5; only providers
    # whose capabilities have client_commits: openai-realtime, xai).
    turn_detection: Literal["server", "client"] = "server"
    # The trunk edge: who may call (sip/core/policy.py, through sip.engine.EngineConfig)
    allow: tuple[str, ...] = ()  # CIDR allowlist; a source outside it gets 403 (or nothing: drop_unknown)
    drop_unknown: bool = False
    inbound_auth: tuple[str, str] | None = None  # (user, password) for a digest challenge; never logged
    allow_any: bool = False  # off loopback with no allowlist and no inbound auth: start anyway, warned
    invite_rate_per_s: float | None = None  # per source, then 503; None: 5/s off loopback, none on it
    options_rate_per_s: float | None = None  # per source, then dropped; None: 10/s off loopback, none on it
    server_header: str | None = None  # Server / User-Agent field; None: none (a scanner reads nothing)
    realm: str | None = None  # inbound digest realm; None: the advertised address (sip.engine.digest_realm)
    # an inbound call whose carrier says verstat=TN-Validation-Failed → 608 Rejected (sip/core/attestation.py)
    refuse_failed_attestation: bool = False
    register: tuple[str, ...] = ()  # sip:USER@HOST[:PORT] bindings to keep (RFC 3261 §10)
    auth_user: str | None = None  # digest user for REGISTER (default: the AoR's user)
    register_password: str | None = None  # never logged
    register_keepalive_s: float | None = 30.0  # OPTIONS to each registrar this often while registered
    register_expires_s: int = 3600  # the registration interval asked for
    blocked_user_agents: tuple[str, ...] = (
        DEFAULT_SCANNERS  # User-Agent substrings dropped (sip/core/policy.py)
    )
    external_address: str | None = None  # NAT: the address peers reach us at
    sip_headers: tuple[str, ...] = (
        DEFAULT_ALLOW  # inbound headers the application sees (sip/core/app_headers.py)
    )
    drain_timeout_s: float = 0.0  # SIGTERM lets live calls finish this long (0: hang up at once)
    amd: bool = False  # answering-machine detection on the calls `dial` places (bridge/engine/amd.py)
    # busy / no-answer retries of the calls `dial` places (bridge/engine/dial_retry.py); one attempt by default
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    amd_options: AmdOptions = field(default_factory=AmdOptions)  # the detector's timers and levels
    amd_machine: AmdAction = "talk"  # after a mailbox verdict: talk, message (then BYE) or hang_up
    amd_message: str | None = None  # the message the model is told to say (amd_machine = "message")
    amd_message_audio: bytes | None = None  # or PCM16 8 kHz mono the bridge plays (wins over the text)
    amd_decide_ms: int = 500  # the application's answer to the verdict is waited for this long
    # inbound: 183 and early media while the provider connects: None or "off", a tone name, 8 kHz PCM16 bytes
    early_media: str | bytes | None = None
    # outbound: the far end's early media goes to the model too (bridge/engine/early_media.py); off: it does not
    early_media_to_provider: bool = False
    # the caller's silence before the model checks in, then before a goodbye ends the call (bridge/engine/no_input.py);
    # 0: never
    no_input_timeout_s: float = 0.0
    cdr: str | None = None  # one JSON line per finished call appended to this file
    record_dir: str | None = None  # a stereo WAV per call in this directory
    recording_consent: Disclosure | None = None  # every call's, where its setup names none (CallSetup)
    route_providers: tuple[ProviderEndpoint, ...] = ()  # providers config routes name (plans.py)
    pricing: tuple[tuple[str, Pricing], ...] = ()  # each provider's rates, by name (bridge/engine/usage.py)
    # The trunks calls placed with `dial` go out on, with their credentials (bridge/server/dialing.py); empty: every
    # call goes direct, challenges answered with the registration's credentials.
    dial_trunks: tuple[DialTrunk, ...] = ()
    nat: bool = False  # NAT mode: symmetric RTP latching, in-dialog requests to the caller's source
    rtp_source: Literal["learn", "strict"] = "learn"  # without NAT mode: rtp/latch.py's source policy
    tls: tuple[str, int] | None = None  # SIP over TLS listener (with cert and tls_key)
    cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None  # CA to verify peers of outbound TLS (default: the system store)
    model: str | None = None  # the provider's model and voice where a call's setup names none
    voice: str | None = None
    srtp: Literal["off", "optional", "required"] = "off"  # SDES-SRTP, keys only over TLS
    codecs: tuple[str, ...] = ("PCMU", "PCMA")  # offered and accepted, in our order (sip.core.offer_answer)
    # Call limits (None: none). `serve` fills in its defaults (bridge.cli.config.call_limits); this API does not.
    max_call_duration_s: float | None = None  # BYE after this long
    rtp_timeout_s: float | None = None  # BYE when the caller sent no RTP for this long (not while held)
    hold_timeout_s: float | None = None  # BYE when the caller held the call this long (rtp/limits.py)
    session_expires_s: int = 1800  # RFC 4028 interval asked and offered (sip/core/ua.py); 0: none
    # Trunks as identities (sip/core/trunks.py): each inbound request is matched to its trunk, whose allowlist,
    # digest, SRTP, NAT, RTP source and external address apply to it alone; each trunk with a registrar keeps
    # its own binding. The fields above are the global policy, for what matches no trunk.
    trunks: tuple[Trunk, ...] = ()


class Server:
    """Answers SIP calls and runs one bridged session per call until stopped."""

    def __init__(self, application: Application, config: ServerConfig) -> None:
        self.application = application
        self.config = config
        self.calls: dict[str, LiveCall] = {}
        self._sessions: dict[str, CallSession] = {}
        self._tasks: set[asyncio.Task[object]] = set()
        self._agent: SipEngine | None = None
        self._fake: Any = None
        self._status: StatusServer | None = None
        self.console = ConsoleFeed()
        self.observer = CallObserver()  # /metrics (bridge/server/observe.py)
        self.draining = False  # /readyz
        self.shutdown = ShutdownSignals()  # SIGTERM and POST /drain (bridge/server/drain.py)
        self.calls_changed = asyncio.Event()  # a call ended (the drain waits on it)
        # the AMD line of the last calls placed with it (`amd_line`; bounded: the oldest go first)
        self._amd_lines: dict[str, str] = {}
        if problem := consent_problem(None, config.recording_consent, config.record_dir):
            raise ValueError(problem)  # an option that cannot be honoured refuses to start
        self.records = RecordKeeper(config.cdr, config.record_dir)  # events, --cdr, --record
        self._browser: BrowserChannel | None = None  # imported (aiortc) only when the HTTP listener is on
        self._console_poll: asyncio.Task[None] | None = None
        self._plans = ProviderPlans(config)  # the default provider and each config route's
        self.dial_keys = DialKeys()  # Idempotency-Key of POST /calls and dial(key=): one key, one call
        # each trunk's calls per second and at once: a dial over either waits in order (bridge/engine/dial_limits.py)
        self.dial_queue = DialQueue(
            DialLimits({t.name: t.limits for t in config.dial_trunks}), count=self.observer.metrics.dial
        )
        self._dial_tickets: dict[str, int] = {}  # a placed call's ticket there, until its task starts
        # each placed call's attempt series by the call id of every attempt, until the series ends
        self._series_of: dict[str, SeriesRun] = {}
        self.dial_clock: Callable[[], int] = (
            time.monotonic_ns
        )  # the retry timers' clock (a test's virtual one)

    async def start(self) -> None:
        """Start the provider fake (echo), the status endpoint and the SIP engine; EngineError (e.g.
        EngineUnavailable naming the extra to install) if the engine cannot be built or start."""
        engine_config = _engine_config(self.config)
        bind = check_listen(engine_config, allow_any=self.config.allow_any)  # no open trunk by mistake
        if not bind.ok:
            raise EngineStartError(bind.error or "no inbound policy")
        if bind.warning:
            log.warning("WARNING: %s", bind.warning)
        engine = create_engine(self.config.engine, engine_config, self._on_call)
        if self._plans.embedded:
            from providers.fakes import openai_live as live_fake

            # One connection per call: no chatter.
            logging.getLogger("providers.fakes").setLevel(logging.WARNING)
            # Calls may last hours: the embedded fake keeps no per-frame record in memory.
            self._fake = await live_fake.serve(
                "127.0.0.1", 0, options=live_fake.LiveFakeOptions(record_client_frames=False)
            )
            self._fake.keep_records = False  # nor a record per finished call (churn)
            self._plans.embed(self._fake.url)
            log.info("provider: echo (embedded GPT-Live fake at %s)", self._fake.url)
        if (default := self._plans.default[0]).key != ECHO_LOCAL_KEY:
            log.info("provider: %s at %s", default.kind.name, default.url or "the default endpoint")
        if self.config.http is not None:
            await self._start_http(self.config.http)
        self._agent = engine
        try:
            await engine.start()
        except EngineError:
            self._agent = None
            await self._close_helpers()
            raise

    async def _start_http(self, address: tuple[str, int]) -> None:
        """The HTTP listener: status, console and its event feed, metrics and probes, the browser channel."""
        source = self._status_source
        talk = None
        channel: Callable[[tuple[str, ...] | None], BrowserChannel] | None = None
        if self.config.browser_channel:
            try:  # aiortc is a dependency; a partial install still serves the console
                from bridge.server.browser import BrowserChannel, BrowserLeg
            except ImportError as exc:
                log.warning("browser channel off (POST /talk answers 404): %s", exc)
            else:

                def on_browser_call(leg: BrowserLeg) -> None:
                    self._on_call(leg, lead_frames=leg.lead_frames)

                def make_channel(hosts: tuple[str, ...] | None) -> BrowserChannel:
                    return BrowserChannel(on_browser_call, ice_hosts=hosts, ice_servers=self.config.stun)

                channel, talk = make_channel, self._talk
        hooks = ConsoleHooks(self.console, self._hangup, talk, self.config.stun)
        extra = self.observer.http_extra(
            self._ready, lambda: self._agent, in_pieces=True
        )  # /metrics scrapes it
        status = StatusServer(
            source,
            console=hooks,
            token=self.config.http_token,
            sip=self._sip_status,
            dial=self._dial_from_http,
            extra=extra,
            drain=http_drain(self, self.shutdown),  # POST /drain
            registry=self.observer.metrics.registry,  # parlora_http_refused_total on /metrics
        )
        self._status = await status.start(*address)
        if channel is not None:
            from bridge.server.browser import ice_hosts_for

            # ICE where the browser reached the page: the listener's own address(es), unless told otherwise
            hosts = (
                (self.config.webrtc_address,)
                if self.config.webrtc_address is not None
                else ice_hosts_for(self._status.addresses)
            )
            try:
                self._browser = channel(hosts)
            except ValueError as exc:
                await self._close_helpers()
                raise EngineStartError(str(exc)) from None
            log.info(
                "browser channel: ICE on %s%s",
                ", ".join(hosts) if hosts is not None else "every interface address",
                f", STUN {', '.join(self.config.stun)}" if self.config.stun else ", no STUN",
            )
        self._console_poll = asyncio.create_task(poll_status(self.console, source), name="console-poll")
        url = f"http://{address[0]}:{self._status.port}"
        log.info("status on %s/calls, console on %s/", url, url)

    async def stop(self) -> bool:
        """Hang up every call, stop the SIP engine; True when it stopped cleanly."""
        clean = True
        for run in set(self._series_of.values()):
            run.cancel("stopped")
        if self._agent is not None:
            clean = await self._agent.stop()  # sessions see CallEnded
            self._agent = None
        if self._browser is not None:
            await self._browser.close()  # browser calls end too (the SIP engine knows nothing of them)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)
        for task in self._tasks:
            task.cancel()
        await self._close_helpers()
        return clean

    async def run(self) -> int:
        """Start, serve until SIGINT or SIGTERM, stop; the process exit status. The first SIGTERM drains for
        `config.drain_timeout_s` first (bridge/server/drain.py); SIGINT or a second SIGTERM stops at once."""
        signals = self.shutdown.install(asyncio.get_running_loop())  # SIGTERM drains (drain.py)
        try:
            await self.start()
        except EngineError as exc:
            log.error(
                "cannot start the SIP engine %s on %s:%d: %s", self.config.engine, *self.config.sip, exc
            )
            return 2
        await signals.requested.wait()
        why = await drain(self, signals, self.config.drain_timeout_s, self.calls_changed)
        if why == "drain timeout":  # the rest get a goodbye from the model, then BYE
            await say_goodbye(self.calls, signals, self.calls_changed)
        log.info("stopping (%s; %d live calls hung up)", why, self.live_calls())
        if not await self.stop():
            log.error("the SIP engine did not stop in time")
            return 1
        log.info("stopped")
        return 0

    async def __aenter__(self) -> Server:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _status_source(self) -> dict[str, Any]:
        """Call id -> status function, each status tagged with its channel and engine for the console."""
        engine = self.config.engine

        def tagged(session: CallSession) -> Any:
            browser = session.leg.identity.header("X-Channel") == "browser"
            return lambda: {
                **session.status(),
                "channel": "browser" if browser else "sip",
                "engine": "webrtc" if browser else engine,
            }

        return {cid: tagged(s) for cid, s in self._sessions.items()}

    def live_calls(self) -> int:
        return len(self.calls)

    def _ready(self) -> tuple[bool, str]:
        """GET /readyz: the SIP engine listening, not draining, and registered where configured."""
        if self._agent is None:
            return False, "not listening"
        if self.draining:
            return False, "draining"
        if self.config.register or any(t.registrar for t in self.config.trunks):
            states = [r.get("state") for r in self._sip_status().get("registrations", [])]
            if "registered" not in states:
                return False, "not registered"
        return True, "listening"

    def _warm_deps(
        self, reconnect: Callable[[int, SessionSettings], Provider], settings: SessionSettings
    ) -> WarmDeps | None:
        """A call's warm transfers (bridge/server/warm.py): the engine's dial, and the briefing session on the
        route's provider with the briefing as its instructions (no tools, no history). The target goes out as
        `dial`'s calls do (the trunk `choose_trunk` picks, its credentials), outside the dial queue: it belongs
        to a call already admitted. None: the engine places no calls."""
        agent = self._agent
        if agent is None or not offers_dial(agent):
            return None
        dialer = agent

        async def dial(target: str, ring_timeout_s: float) -> CallLeg:
            via = choose_trunk(self.config.dial_trunks, target)  # as `dial`: the trunk's identity and digest
            auth_user, password = via.credentials if via is not None else (None, "")
            return await dialer.dial(
                dial_target(target, via),
                from_uri=via.identity if via is not None else None,
                ring_timeout_s=ring_timeout_s,
                auth_user=auth_user,
                password=password,
            )

        def briefing(leg: CallLeg, instructions: str) -> CallSession:
            brief = replace(settings, instructions=instructions, tools=(), history=())
            failure = self.config.failure_message
            return CallSession(
                leg, reconnect(1, brief), reconnect=reconnect, settings=brief, failure_message=failure
            )

        return WarmDeps(dial, briefing, self.config.hold_music or b"")

    async def dial(
        self,
        to: str,
        *,
        from_uri: str | None = None,
        ring_timeout_s: float | None = 60.0,
        trunk: str | None = None,
        route: str | None = None,
        key: str | None = None,
        headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
    ) -> str:
        """Place a call to `to` (sip:USER@HOST[:PORT], or a number to dial through a trunk) and run
        the same session engine on it: the provider connection opens while the callee's phone rings. It goes
        out on `trunk` or the one `bridge.server.dialing.choose_trunk` picks from `config.dial_trunks`, whose
        credentials answer its challenges; the application sets it up with `setup_outbound` (`route`: the one
        named, None to choose by the dialled number). Returns the call id; busy / no answer / failed end the
        call with that SIP status (in the log and `GET /sip`'s "outbound"). ValueError for a bad URI or an
        unknown trunk or route (nothing is sent), EngineError when the engine cannot place calls or is not
        running.

        `key` (an Idempotency-Key, bridge/server/idempotency.py): a repeat returns the first call's id and places
        nothing (waiting for the first while it is being placed); the same key with other arguments is
        `KeyReused` (a ValueError). `headers` go on the INVITE (X-*, P-Asserted-Identity, Identity, ...:
        sip/core/outbound.py `check_headers` says which and why); one that breaks those rules is a ValueError and
        nothing is sent."""
        request = DialRequest(to, from_uri, ring_timeout_s, trunk, route, check_headers(headers))
        return (await self._dial(request, key)).call_id

    async def _dial(self, request: DialRequest, key: str | None) -> Dialled:
        """`dial`, telling whether the call id is an earlier call's (a repeated key)."""
        if key is None:
            return Dialled(await self._place(request))
        dialled = await self.dial_keys.once(key, request, time.monotonic_ns(), lambda: self._place(request))
        if dialled.replayed:
            self.observer.metrics.idempotent_replay()
            log.info("call %s: a repeated Idempotency-Key, no second call", dialled.call_id)
        return dialled

    async def _place(self, request: DialRequest, run: SeriesRun | None = None) -> str:
        """One attempt of a dial: the first (`run` None: its series begins here) or the next of `run`'s. Each is
        checked as a first dial is; a refusal is a CDR row (and the series' end) before it is raised."""
        to, from_uri, ring_timeout_s, trunk, route, headers = (
            request.to,
            request.from_uri,
            request.ring_timeout_s,
            request.trunk,
            request.route,
            request.headers,
        )
        agent = self._agent
        if agent is None:
            raise EngineError("the SIP engine is not running")
        if not offers_dial(agent):
            raise EngineError(f"placing calls is not supported on the {self.config.engine} engine")
        try:
            self.application.check_outbound(to, route)
        except OutsideCallingHours as exc:
            await self._dial_refused(request, run, "calling_hours", str(exc), None)
            raise
        except ValueError as exc:  # the do-not-call hook, or a request the application refuses
            why = "do_not_call" if isinstance(exc, DoNotCall) else "application"
            await self._dial_refused(request, run, why, str(exc), None)
            raise
        policy = run.core.policy if run is not None else self.application.retry_policy(to, route)
        via = choose_trunk(self.config.dial_trunks, to, trunk)
        target = dial_target(to, via)
        # no trunk: no credentials ("" — never the engine's own, which are a trunk's)
        auth_user, password = via.credentials if via is not None else (None, "")
        trunk_name = via.name if via is not None else None
        try:
            ticket = await self.dial_queue.admit(trunk_name)
        except DialRefused as exc:
            await self._dial_refused(request, run, exc.refused.reason, str(exc), trunk_name)
            raise
        try:
            leg = await agent.dial(
                target,
                from_uri=from_uri or (via.identity if via is not None else None),
                ring_timeout_s=ring_timeout_s,
                auth_user=auth_user,
                password=password,
                **({"headers": headers} if headers else {}),  # an engine without headers is called as before
            )
        except BaseException:
            self.dial_queue.ended(ticket)  # its line and its place go to the next dial
            raise
        log.info(
            "call %s: to %s via %s", leg.identity.call_id, target, f"trunk {via.name}" if via else "no trunk"
        )
        call_id = leg.identity.call_id
        self._dial_tickets[call_id] = ticket  # freed when the call's task ends (`_on_call`)
        if run is None:
            core = DialSeries(policy or self.config.retry)
            run = SeriesRun(
                core, request, redial=self._redial, finished=self._series_finished, clock=self.dial_clock
            )
        elif run.core.attempts:
            self.observer.metrics.dial_retry(run.core.attempts[-1].outcome or "failed")
        run.core.placed(call_id)
        self._series_of[call_id] = run  # the attempt's end goes to its series (`_run_call`, `_on_call`)
        self._on_call(leg, route=route)
        return call_id

    async def _dial_refused(
        self, request: DialRequest, run: SeriesRun | None, reason: str, detail: str, trunk: str | None
    ) -> None:
        """A dial refused before anything was sent: a CDR row with its reason, and its series' end."""
        if reason not in ("queue_full", "queue_timeout"):  # (the queue counts its own refusals)
            self.observer.metrics.dial(trunk, f"refused_{reason}")
        body: dict[str, Any] = {
            "to": request.to,
            "route": request.route,
            "trunk": trunk,
            "reason": reason,
            "detail": detail,
        }
        if run is not None:
            body["series"], body["attempt"] = run.id, len(run.core.attempts) + 1
        log.info("dial to %s refused (%s): %s", request.to, reason, detail)
        await self.records.row(DialRow("dial_refused", time.time(), body))
        if run is not None:
            run.refused(reason, detail)

    def _redial(self, run: SeriesRun) -> None:
        """A series' next attempt is due: placed, unless the server is draining or stopped."""
        if self.draining or self._agent is None:
            run.cancel("draining" if self.draining else "stopped")
            return
        self._on_call_task(self._attempt_again(run), f"dial-{run.id}-{len(run.core.attempts) + 1}")

    async def _attempt_again(self, run: SeriesRun) -> None:
        try:
            await self._place(run.request, run)
        except (OutsideCallingHours, DialRefused, ValueError):
            pass  # refused: a CDR row and the series' end (`_dial_refused`)
        except Exception as exc:  # nothing was placed (the engine stopped, ...)
            log.warning("dial %s: attempt %d failed: %s", run.id, len(run.core.attempts) + 1, exc)
            run.refused("failed", str(exc))

    def _series_finished(self, run: SeriesRun) -> None:
        """A dial's series is over: forgotten, and a CDR row when it could have had more than one attempt."""
        core, final = run.core, run.core.final
        for attempt in core.attempts:
            if attempt.call_id is not None and self._series_of.get(attempt.call_id) is run:
                del self._series_of[attempt.call_id]
        if final is None:
            return
        log.info(
            "dial %s: %s after %d attempt(s) (%s)", run.id, final.outcome, len(core.attempts), final.reason
        )
        if core.policy.attempts > 1:
            request = run.request
            body = {"to": request.to, "route": request.route, **core.to_json()}
            self._on_call_task(
                self.records.row(DialRow("dial_series", time.time(), body)), f"dial-{run.id}-row"
            )

    def cancel_dial(self, call_id: str, reason: str = "cancelled by the application") -> bool:
        """No further attempt of the dial whose series holds `call_id` (any attempt's id); an attempt still
        ringing is hung up. False when no series holds it (a call not placed by `dial`, or one already over)."""
        run = self._series_of.get(call_id)
        if run is None:
            return False
        run.cancel(reason)
        for attempt in run.core.attempts:
            if (
                attempt.call_id is not None
                and attempt.outcome is None
                and (live := self.calls.get(attempt.call_id))
            ):
                live.hang_up(reason)
        return True

    def _attempt_over(self, call_id: str, session: CallSession) -> dict[str, Any] | None:
        """A placed call's attempt is over: its series decides (the next attempt, or the end); its record's line."""
        run = self._series_of.get(call_id)
        if run is None:
            return None
        ended = session.leg_ended
        status = ended.status_code if ended is not None else 0
        reason = ended.reason if ended is not None else "unknown"
        return run.attempt_ended(call_id, status, session.answered_ns is not None, reason)

    async def _dial_from_http(
        self,
        to: str,
        from_uri: str | None,
        trunk: str | None = None,
        route: str | None = None,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
    ) -> Dialled:
        """POST /calls {"to": "sip:...", "from": "sip:...", "trunk": NAME, "route": NAME, "headers": {...}}
        with its Idempotency-Key."""
        return await self._dial(DialRequest(to, from_uri, 60.0, trunk, route, check_headers(headers)), key)

    def _sip_status(self) -> dict[str, Any]:
        """GET /sip: the engine's listener and inbound-policy counters, where it reports them."""
        agent = self._agent
        if offers_status(agent):
            return agent.sip_status()
        return {"engine": self.config.engine, "running": agent is not None}

    def _hangup(self, call_id: str) -> bool:
        """The console's hang-up button (POST /calls/{id}/hangup)."""
        if self.cancel_dial(call_id, "hung up from the console"):  # a placed call: no further attempt either
            return True
        call = self.calls.get(call_id)
        if call is None:
            return False
        call.hang_up("hung up from the console")
        return True

    async def _talk(self, offer_sdp: str, source: str) -> tuple[str, str]:
        """The browser channel's offer/answer (POST /talk): ValueError for a malformed offer."""
        if self._browser is None:
            raise ValueError("the browser channel is off")
        answer = await self._browser.answer(offer_sdp, source)
        return answer.call_id, answer.sdp

    async def _close_helpers(self) -> None:
        if self._console_poll is not None:
            self._console_poll.cancel()
            self._console_poll = None
        if self._browser is not None:
            await self._browser.close()
            self._browser = None
        if self._status is not None:
            await self._status.close()
            self._status = None
        if self._fake is not None:
            await self._fake.close()
            self._fake = None

    def amd_line(self, call_id: str) -> str | None:
        """The machine detection of a call placed with AMD on (`amd_line`), once it has ended; else None."""
        return self._amd_lines.get(call_id)

    def _keep_amd_line(self, call_id: str, line: str) -> None:
        self._amd_lines[call_id] = line
        while len(self._amd_lines) > _KEPT_AMD_LINES:
            del self._amd_lines[next(iter(self._amd_lines))]

    def drain(self) -> None:
        """Refuse new calls (503) while live calls finish (DESIGN §11: graceful drain behind a load balancer)."""
        if self._agent is not None:
            self._agent.drain()
        self.draining = True
        for run in set(self._series_of.values()):  # no dial is retried from now on
            run.cancel("draining")

    def _on_call(self, leg: CallLeg, *, lead_frames: int | None = None, route: str | None = None) -> None:
        """Run one call (a SIP engine's leg, or a browser's with its larger cushion in `lead_frames`; `route`:
        the one an outbound call's request named). A call placed through a trunk's limits frees its place there
        when it ends."""
        LOG_CALLS.open(leg.identity.call_id, leg.identity.sip_call_id)  # JSON log lines' context
        task: asyncio.Task[object] = asyncio.create_task(
            self._run_call(leg, lead_frames, route), name=leg.identity.call_id
        )
        self._tasks.add(task)
        task.add_done_callback(_call_done(self._tasks))
        if (ticket := self._dial_tickets.pop(leg.identity.call_id, None)) is not None:
            queue = self.dial_queue
            task.add_done_callback(lambda _: queue.ended(ticket))
        if (run := self._series_of.get(call_id := leg.identity.call_id)) is not None:
            # an attempt whose task ended before its session did (refused by the application's setup): over
            task.add_done_callback(lambda _: run.attempt_ended(call_id, 0, False, "ended before its session"))

    def _on_call_task(self, coro: Coroutine[Any, Any, object], name: str) -> None:
        task: asyncio.Task[object] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_call(self, leg: CallLeg, lead_frames: int | None = None, route: str | None = None) -> None:
        app, identity = self.application, leg.identity
        attestation = (
            attestation_of(identity.from_uri, identity.headers) if identity.direction == "inbound" else None
        )
        if attestation is not None and attestation.reason:
            self.observer.metrics.identity_ignored(attestation.reason)
        outbound = identity.direction == "outbound"
        if (
            self.config.refuse_failed_attestation
            and attestation is not None
            and attestation.verstat == "failed"
        ):
            # before the application and any provider: the policy of sip/core/attestation.py
            log.info("call %s: refused 608: caller ID failed STIR/SHAKEN verification", identity.call_id)
            leg.hangup("Rejected", status=608)
            self.observer.call_refused(None, 608)
            body = {"call_id": identity.call_id, "from": identity.from_uri, "to": identity.to_uri}
            row = DialRow(
                "call_refused", time.time(), {**body, "reason": "attestation_failed", "sip_status": 608}
            )
            await self.records.row(row)
            return
        try:
            if identity.direction == "outbound":
                setup = await app.setup_outbound(identity, route)
            else:
                setup = await app.setup(identity)
        except CallRefused as refused:  # e.g. no config route for the called number (404)
            log.info("call %s: refused %d: %s", identity.call_id, refused.status, refused.reason)
            leg.hangup(refused.reason, status=refused.status)
            self.observer.call_refused(None, refused.status)
            return
        except Exception:
            log.exception("call %s: the application's setup failed; answering 500", identity.call_id)
            leg.hangup("application setup failed", status=500)
            self.observer.call_refused(None, 500)
            return
        if setup.recording_consent is None and self.config.recording_consent is not None:
            setup = replace(setup, recording_consent=self.config.recording_consent)
        if problem := consent_problem(setup.disclosure, setup.recording_consent, self.config.record_dir):
            log.error("call %s: refused 500: %s", identity.call_id, problem)  # it cannot be honoured
            leg.hangup("recording consent cannot be honoured", status=500)
            self.observer.call_refused(None, 500)
            return
        plan, rollover = self._plans.for_call(setup.provider)  # the route's provider
        telephony, settings = (
            self.config.telephony,
            call_settings(_settings(self.config, setup), plan.settings),
        )
        choice = replace(plan, settings=settings, media_rate=identity.media_rate)  # a 16 kHz leg: wide format

        def reconnect(token: int, seeded: SessionSettings) -> Provider:
            return replace(choice, settings=seeded).connect(token)

        holder: list[LiveCall] = []
        amd = (
            _amd_plan(setup, self.config)
            if identity.direction == "outbound" and _amd(setup, self.config)
            else None
        )
        consent = setup.recording_consent
        records = self.records.call(
            identity,
            setup.route,
            _provider_name(plan),
            self.observer.events(_to(app, holder)),  # each turn's times to /metrics
            setup.disclosure,
            consent,
        )
        session = CallSession(
            leg,
            choice.connect(token=1),
            reconnect=reconnect,
            settings=settings,
            failure_message=self.config.failure_message,
            options=replace(
                CoordinatorOptions(rollover=rollover, disclosure=setup.disclosure, consent=consent)
                if lead_frames is None
                else CoordinatorOptions(
                    rollover=rollover, lead_frames=lead_frames, disclosure=setup.disclosure, consent=consent
                ),
                no_input=_no_input(setup, self.config),
                pricing=dict(self.config.pricing).get(_provider_name(plan)),  # the call's price
                budget=setup.budget,
            ),
            job_handler=lambda job: app.job(holder[0], job),
            approve=lambda rollover_id: app.approve_rollover(holder[0], rollover_id),
            authorize=app.authorize,
            telephony_options=telephony,
            dtmf_handler=lambda digit: app.dtmf(holder[0], digit),
            card_handler=lambda result: app.card_collected(holder[0], result),
            notice_sink=self.observer.tee(records.sink(self.console.notice)),
            media_tap=records.tap,  # --record
            amd=amd,
            amd_hook=None
            if amd is None
            else lambda verdict, default: app.amd_action(holder[0], verdict, default),
            early_media_to_provider=outbound and _early_to_provider(setup, self.config),
            warm=self._warm_deps(reconnect, settings),
        )
        session.links.on_connected = self.observer.metrics.provider_connected  # connect time
        call = LiveCall(identity, session)
        holder.append(call)
        _goodbye_at_time_limit(leg, call, telephony)  # --max-call-duration says goodbye first
        self.calls[identity.call_id] = call
        self._sessions[identity.call_id] = session
        self.observer.call_started(setup.route)
        summary: CallSummary | None = None
        records.begin(session.started_ns, leg.ledger)  # call_started
        if not outbound:
            _play_early_media(leg, setup, self.config)  # while the provider connects
        if (
            greeting := _first_words(setup)
        ) and amd is None:  # the model speaks first (bridge/server/greeting.py);
            # with AMD on, the first words are asked for when the verdict's action is to talk (bridge/engine/amd.py)
            self._on_call_task(greet(call, greeting), f"{identity.call_id}-greeting")
        try:
            summary = await session.run()
            dial = self._attempt_over(identity.call_id, session)  # a placed call's series: retry or end
            await records.end(summary, session.status(), answered=session.coordinator is not None, dial=dial)
            try:
                await app.ended(call, summary)
            except Exception:
                log.exception("call %s: the application's ended() failed", identity.call_id)
        finally:
            dial = self._attempt_over(identity.call_id, session)
            await records.end(
                summary, session.status(), answered=session.coordinator is not None, dial=dial
            )  # once
            if amd_events := session.amd_events:
                self._keep_amd_line(identity.call_id, amd_line(amd_events, session.amd_action))
            self.calls.pop(identity.call_id, None)
            self._sessions.pop(identity.call_id, None)
            self.observer.call_ended(setup.route, summary, leg)
            self.calls_changed.set()


def _amd(setup: CallSetup, config: ServerConfig) -> bool:
    """An outbound call's machine detection: its route's (`amd`), else the server's (`[outbound] amd`)."""
    return config.amd if setup.amd is None else setup.amd


def _early_to_provider(setup: CallSetup, config: ServerConfig) -> bool:
    """An outbound call's early media to the model: its route's, else the server's (off by default)."""
    if setup.early_media_to_provider is not None:
        return setup.early_media_to_provider
    return config.early_media_to_provider


def _no_input(setup: CallSetup, config: ServerConfig) -> NoInputOptions | None:
    """The call's no-input timeout: its route's (`no_input_timeout_s`), else the server's; None: off."""
    seconds = config.no_input_timeout_s if setup.no_input_timeout_s is None else setup.no_input_timeout_s
    return NoInputOptions(round(seconds * 1000)) if seconds > 0 else None


def _play_early_media(leg: CallLeg, setup: CallSetup, config: ServerConfig) -> None:
    """An inbound call's early media (its route's `early_media`, else the server's): a 183 with the SDP answer
    and a ringback tone or an announcement until the answer (sip/native/early.py)."""
    audio = setup.early_media if setup.early_media is not None else config.early_media
    if audio is None or audio == "off":
        return
    call_id = leg.identity.call_id
    if not offers_early_media(leg):
        log.info("call %s: no early media: its leg cannot send any", call_id)
        return
    try:
        leg.play_early_media(audio)
    except KeyError:
        log.warning("call %s: no early media: no tone named %r", call_id, audio)


def _amd_plan(setup: CallSetup, config: ServerConfig) -> AmdPlan:
    """An outbound call's machine detection and what follows it: its setup's (its route's) choice and message
    over the server's."""
    own = setup.amd_message is not None or setup.amd_message_audio is not None  # replaces the server's
    machine = (
        setup.amd_machine if setup.amd_machine is not None and setup.amd_machine in AMD_ACTIONS else None
    )
    return AmdPlan(
        options=config.amd_options,
        policy=AmdPolicy(machine=machine or config.amd_machine, decide_ms=config.amd_decide_ms),
        greeting=_first_words(setup),
        message=setup.amd_message if own else config.amd_message,
        message_audio=setup.amd_message_audio if own else config.amd_message_audio,
    )


def amd_line(events: list[AmdEvent], action: AmdStart | None = None) -> str:
    """What `call` prints of a call's machine detection: "AMD machine after 2510 ms (a greeting of ...);
    beep after 3400 ms; message after 3400 ms (the route's choice)"."""
    parts = []
    for event in events:
        if isinstance(event, AmdVerdict):
            parts.append(f"AMD {event.kind} after {event.since_answer_ms} ms ({event.reason})")
        else:
            name = "beep" if isinstance(event, AmdBeep) else "no beep"
            parts.append(f"{name} after {event.since_answer_ms} ms ({event.reason})")
    if action is not None:
        parts.append(f"{action.action} after {action.since_answer_ms} ms (the {action.by}'s choice)")
    return "; ".join(parts)


def _call_done(tasks: set[asyncio.Task[object]]) -> Callable[[asyncio.Task[object]], None]:
    """A call's task ended: forget it, and its JSON log context (the task is named by the call id)."""

    def done(task: asyncio.Task[object]) -> None:
        tasks.discard(task)
        LOG_CALLS.close(task.get_name())

    return done


def _goodbye_at_time_limit(leg: CallLeg, call: LiveCall, options: TelephonyOptions) -> None:
    """--max-call-duration, where the engine enforces it: at the limit the model is asked for a
    short goodbye and the call is hung up once it has been played (`LiveCall.say_goodbye`, the CallEnding
    mechanism of end_call); a call that is not live any more is hung up at once."""
    if not offers_time_limit(leg):
        return

    def time_up(reason: str) -> None:
        if not call.say_goodbye(TIME_LIMIT_NOTE, reason):
            call.hang_up(reason)

    leg.on_time_limit(time_up, time_limit_grace_s(options))


def outbound_outcome(server: Server, call_id: str) -> dict[str, Any] | None:
    """How a call placed with `Server.dial` ended, as `GET /sip`'s "outbound" reports it: outcome
    ("answered", "busy", "no answer", "cancelled", "failed"), SIP status and reason; None if not recorded."""
    outbound = server._sip_status().get("outbound") or []
    return next((o for o in reversed(outbound) if o.get("call") == call_id), None)


def _lines(setup: CallSetup) -> str | None:
    """The lines the model must say first: the disclosure's, then the recording consent's (one line when both
    are text: bridge/engine/disclosure.py; the record checks the first utterance for each)."""
    lines = [
        a.text for a in (setup.disclosure, setup.recording_consent) if a is not None and a.text is not None
    ]
    return " ".join(lines) if lines else None


def consent_problem(
    disclosure: Disclosure | None, consent: Disclosure | None, record_dir: str | None
) -> str | None:
    """What a recording consent asks that cannot be honoured: a recording that is off, or a recorded consent
    after a disclosure the model says (the bridge plays its recordings first; the disclosure comes first)."""
    if consent is None:
        return None
    if record_dir is None:
        return "a recording consent is announced only for a recording, and recording is off"
    if consent.audio is not None and disclosure is not None and disclosure.text is not None:
        return (
            "a recorded consent cannot follow a disclosure the model says (the disclosure comes first): give "
            "both as recordings, or the consent as a line of text"
        )
    return None


def _first_words(setup: CallSetup) -> str | None:
    """What the model is asked to say as the call comes up: the greeting, after the disclosure and recording
    consent lines when the route has them (bridge/engine/disclosure.py: the record checks that the first
    utterance said them)."""
    line = _lines(setup)
    if line is None:
        return setup.greeting
    return disclosure_instruction(line) + (f" Then: {setup.greeting}" if setup.greeting else "")


def _settings(config: ServerConfig, setup: CallSetup) -> SessionSettings:
    """One call's session settings: its setup over the server's defaults, with the telephony tools (and a
    disclosure line's instruction: bridge/engine/disclosure.py)."""
    instructions = setup.instructions or config.instructions
    if (line := _lines(setup)) is not None:
        rule = disclosure_instruction(line)
        instructions = f"{instructions}\n\n{rule}" if instructions else rule
    return SessionSettings(
        instructions=instructions,
        voice=setup.voice,
        tools=setup.tools + tool_specs(config.telephony),
        history=setup.history,
        turn_detection=config.turn_detection,
        language=setup.language,
    )


def call_settings(settings: SessionSettings, provider: SessionSettings) -> SessionSettings:
    """A call's settings with its provider's model and voice where the call's own setup names none."""
    return replace(settings, model=settings.model or provider.model, voice=settings.voice or provider.voice)


def _provider_name(plan: ProviderChoice) -> str:
    """The provider a call's record names: "echo" for the embedded fake (it speaks GPT-Live's protocol)."""
    return "echo" if plan.key == ECHO_LOCAL_KEY else plan.kind.name


def _to(app: Application, holder: list[LiveCall]) -> Callable[[AppEvent], Coroutine[Any, Any, None]]:
    """Each of a call's events to the application's handler for it."""

    async def deliver(event: AppEvent) -> None:
        call = holder[0]
        if isinstance(event, CallStarted):
            await app.call_started(call, event)
        elif isinstance(event, Utterance):
            await app.utterance(call, event)
        elif isinstance(event, UncertainWork):
            await app.work_uncertain(call, event)
        elif isinstance(event, AmdResult):
            await app.amd_result(call, event)
        elif isinstance(event, EarlyMediaReport):
            await app.early_media(call, event)
        else:
            await app.call_ended(call, event.record)

    return deliver


def _engine_config(config: ServerConfig) -> EngineConfig:
    """What the SIP engine is told of the server's configuration."""
    host, port = config.sip
    return EngineConfig(
        host=host,
        port=port,
        rtp_port=config.rtp_port,
        rtp_port_high=config.rtp_port_high,
        tcp=config.sip_tcp,
        max_calls=config.max_calls,
        allow=config.allow,
        drop_unknown=config.drop_unknown,
        inbound_auth=config.inbound_auth,
        invite_rate_per_s=config.invite_rate_per_s,
        options_rate_per_s=config.options_rate_per_s,
        server_header=config.server_header,
        realm=config.realm,
        register=config.register,
        auth_user=config.auth_user,
        register_password=config.register_password,
        register_keepalive_s=config.register_keepalive_s,
        register_expires_s=config.register_expires_s,
        scanner_user_agents=config.blocked_user_agents,
        sip_headers=config.sip_headers,
        external_address=config.external_address,
        nat=config.nat,
        rtp_source=config.rtp_source,
        tls=config.tls,
        cert=config.cert,
        tls_key=config.tls_key,
        tls_ca=config.tls_ca,
        srtp=config.srtp,
        codecs=config.codecs,
        max_call_duration_s=config.max_call_duration_s,
        rtp_timeout_s=config.rtp_timeout_s,
        hold_timeout_s=config.hold_timeout_s,
        session_expires_s=config.session_expires_s,
        trunks=config.trunks,
    )
