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
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from bridge.console import ConsoleFeed, ConsoleHooks, poll_status
from bridge.coordinator import CoordinatorOptions
from bridge.delegations import JobRequest
from bridge.drain import ShutdownSignals, drain
from bridge.greeting import greet
from bridge.http import StatusServer
from bridge.observe import CallObserver
from bridge.providers import KINDS, ProviderChoice
from bridge.rollover import RolloverOptions
from bridge.session import CallSession, CallSummary
from bridge.telephony import TelephonyOptions, tool_specs
from providers.base import Provider, SessionSettings, ToolSpec
from providers.limits import LimitOverrides
from sip.engine import (
    DEFAULT_ENGINE,
    Dialer,
    EngineConfig,
    EngineError,
    EngineStartError,
    SipEngine,
    SipStatus,
    check_listen,
    create_engine,
)
from sip.leg import CallIdentity, CallLeg

if TYPE_CHECKING:
    from bridge.browser import BrowserChannel

log = logging.getLogger("parlora")

ECHO_LOCAL_KEY = "echo-local"  # the embedded fake accepts any bearer token; this one is not a secret


@dataclass(frozen=True, slots=True)
class CallSetup:
    """What one call's sessions are configured with (every connection of the call: rollovers and recoveries
    are seeded from it)."""

    instructions: str | None = None
    voice: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    history: tuple[tuple[str, str], ...] = ()  # (role, text) before the caller speaks
    greeting: str | None = None  # issue 15: asked of the model as soon as the call is answered (speaks first)
    route: str | None = None  # issue 15: the config route that chose this setup (logs, metrics)


class CallRefused(Exception):  # noqa: N818 - a refusal the application means, not an error
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

    def hang_up(self, reason: str = "ended by the application") -> None:
        self._session.leg.hangup(reason)


class Application:
    """The application side of the bridge. Override what you need; the defaults answer like `serve`."""

    async def setup(self, call: CallIdentity) -> CallSetup:
        """Per call, before it is answered: instructions and tools from the called number and SIP headers."""
        return CallSetup()

    async def job(self, call: LiveCall, job: JobRequest) -> str:
        """A tool call or delegation, dispatched once however often the provider delivers it; the returned
        text (JSON or plain) is the model's answer. An exception becomes an error answer for the model."""
        return '{"error": "no application handler is configured for tools"}'

    async def dtmf(self, call: LiveCall, digit: str) -> None:
        """The caller pressed a key (RFC 4733)."""

    async def ended(self, call: LiveCall, summary: CallSummary) -> None:
        """The call is over."""

    async def approve_rollover(self, call: LiveCall, rollover_id: str) -> bool:
        """Before a rollover opens the next connection (RO6): False or an exception refuses it."""
        return True

    async def authorize(self, connection_id: str) -> bool:
        """Before every provider connection is opened (RO7), keyed by "<call id>/conn-N"."""
        return True


@dataclass(frozen=True)
class ServerConfig:
    """Where to answer calls and which provider to bridge them to."""

    provider: str = "echo"  # "echo" (the embedded GPT-Live fake) or a name in bridge.providers.KINDS
    key: str | None = None  # the provider's API key (never logged)
    provider_url: str | None = None
    provider_options: tuple[tuple[str, Any], ...] = ()  # adapter keyword arguments (e.g. ssl_context)
    sip: tuple[str, int] = ("127.0.0.1", 5060)
    rtp_port: int = 4000
    max_calls: int | None = None  # None: the engine's default (sip.engine.ENGINES[engine].default_max_calls)
    http: tuple[str, int] | None = None  # GET /calls status endpoint, the console at / and POST /talk
    http_token: str | None = None  # bearer token for the HTTP listener (required off loopback: bridge/cli.py)
    browser_channel: bool = True  # POST /talk: WebRTC calls from the console page (bridge/browser.py)
    instructions: str | None = None  # used when the application's setup gives none
    limits: LimitOverrides | None = None
    failure_message: bytes | None = None
    rollover: RolloverOptions | None | str = "default"  # "default": from the provider's cap; None: off
    telephony: TelephonyOptions = field(default_factory=TelephonyOptions)
    engine: str = DEFAULT_ENGINE  # the SIP engine: a name in sip.engine.ENGINES
    # "client": the provider's turn detection off, the engine commits each caller turn (RO5; only providers
    # whose capabilities have client_commits: openai-realtime, xai).
    turn_detection: Literal["server", "client"] = "server"
    # issue 14, the trunk edge: who may call (sip/policy.py, through sip.engine.EngineConfig)
    allow: tuple[str, ...] = ()  # CIDR allowlist; a source outside it gets 403 (or nothing: drop_unknown)
    drop_unknown: bool = False
    inbound_auth: tuple[str, str] | None = None  # (user, password) for a digest challenge; never logged
    allow_any: bool = False  # off loopback with no allowlist and no inbound auth: start anyway, warned
    invite_rate_per_s: float | None = None  # per source, then 503; None: 5/s off loopback, none on it
    register: tuple[str, ...] = ()  # sip:USER@HOST[:PORT] bindings to keep (RFC 3261 §10)
    auth_user: str | None = None  # digest user for REGISTER (default: the AoR's user)
    register_password: str | None = None  # never logged
    external_address: str | None = None  # NAT: the address peers reach us at
    drain_timeout_s: float = 0.0  # issue 15: SIGTERM lets live calls finish this long (0: hang up at once)
    nat: bool = False  # NAT mode: symmetric RTP latching, in-dialog requests to the caller's source
    tls: tuple[str, int] | None = None  # SIP over TLS listener (with cert and tls_key)
    cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None  # CA to verify peers of outbound TLS (default: the system store)
    srtp: Literal["off", "optional", "required"] = "off"  # SDES-SRTP, keys only over TLS
    max_call_duration_s: float | None = None  # BYE after this long
    rtp_timeout_s: float | None = None  # BYE when the caller sent no RTP for this long


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
        self.observer = CallObserver()  # issue 15: /metrics (bridge/observe.py)
        self.draining = False  # issue 15: /readyz
        self.calls_changed = asyncio.Event()  # issue 15: a call ended (the drain waits on it)
        self._browser: BrowserChannel | None = None  # imported (aiortc) only when the HTTP listener is on
        self._console_poll: asyncio.Task[None] | None = None
        self._embedded = config.provider == "echo" and config.provider_url is None
        self._choice, self._rollover = _provider_plan(config)

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
        if self._embedded:
            from providers.fakes import openai_live as live_fake

            # One connection per call: no chatter.
            logging.getLogger("providers.fakes").setLevel(logging.WARNING)
            # Calls may last hours: the embedded fake keeps no per-frame record in memory.
            self._fake = await live_fake.serve(
                "127.0.0.1", 0, options=live_fake.LiveFakeOptions(record_client_frames=False)
            )
            self._choice = replace(self._choice, url=self._fake.url)
            log.info("provider: echo (embedded GPT-Live fake at %s)", self._fake.url)
        else:
            log.info("provider: %s at %s", self._choice.kind.name, self._choice.url or "the default endpoint")
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
        if self.config.browser_channel:
            try:  # aiortc is a dependency; a partial install still serves the console
                from bridge.browser import BrowserChannel, BrowserLeg
            except ImportError as exc:
                log.warning("browser channel off (POST /talk answers 404): %s", exc)
            else:

                def on_browser_call(leg: BrowserLeg) -> None:
                    self._on_call(leg, lead_frames=leg.lead_frames)

                self._browser = BrowserChannel(on_browser_call)
                talk = self._talk
        hooks = ConsoleHooks(self.console, self._hangup, talk)
        extra = self.observer.http_extra(self._ready)
        status = StatusServer(
            source,
            console=hooks,
            token=self.config.http_token,
            sip=self._sip_status,
            dial=self._dial_from_http,
            extra=extra,
        )
        self._status = await status.start(*address)
        self._console_poll = asyncio.create_task(poll_status(self.console, source), name="console-poll")
        url = f"http://{address[0]}:{self._status.port}"
        log.info("status on %s/calls, console on %s/", url, url)

    async def stop(self) -> bool:
        """Hang up every call, stop the SIP engine; True when it stopped cleanly."""
        clean = True
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
        `config.drain_timeout_s` first (bridge/drain.py); SIGINT or a second SIGTERM stops at once."""
        signals = ShutdownSignals(asyncio.get_running_loop())  # issue 15: SIGTERM drains (bridge/drain.py)
        try:
            await self.start()
        except EngineError as exc:
            log.error(
                "cannot start the SIP engine %s on %s:%d: %s", self.config.engine, *self.config.sip, exc
            )
            return 2
        await signals.requested.wait()
        why = await drain(self, signals, self.config.drain_timeout_s, self.calls_changed)
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
        """GET /readyz (issue 15): the SIP engine listening, not draining, and registered where configured."""
        if self._agent is None:
            return False, "not listening"
        if self.draining:
            return False, "draining"
        if self.config.register:
            states = [r.get("state") for r in self._sip_status().get("registrations", [])]
            if "registered" not in states:
                return False, "not registered"
        return True, "listening"

    async def dial(self, to: str, *, from_uri: str | None = None, ring_timeout_s: float | None = 60.0) -> str:
        """Place a call to `to` (sip:USER@HOST[:PORT]; issue 14) and run the same session engine on it: the
        provider connection opens while the callee's phone rings. Returns the call id; busy / no answer /
        failed end the call with that SIP status (in the log and `GET /sip`'s "outbound"). ValueError for a
        bad URI, EngineError when the engine cannot place calls or is not running."""
        agent = self._agent
        if agent is None:
            raise EngineError("the SIP engine is not running")
        if not isinstance(agent, Dialer):
            raise EngineError(f"the {self.config.engine} engine cannot place calls")
        leg = await agent.dial(to, from_uri=from_uri, ring_timeout_s=ring_timeout_s)
        self._on_call(leg)
        return leg.identity.call_id

    async def _dial_from_http(self, to: str, from_uri: str | None) -> str:
        """POST /calls {"to": "sip:...", "from": "sip:..."} (issue 14)."""
        return await self.dial(to, from_uri=from_uri)

    def _sip_status(self) -> dict[str, Any]:
        """GET /sip (issue 14): the engine's listener and inbound-policy counters, where it reports them."""
        agent = self._agent
        if isinstance(agent, SipStatus):
            return agent.sip_status()
        return {"engine": self.config.engine, "running": agent is not None}

    def _hangup(self, call_id: str) -> bool:
        """The console's hang-up button (POST /calls/{id}/hangup)."""
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

    def drain(self) -> None:
        """Refuse new calls (503) while live calls finish (DESIGN §11: graceful drain behind a load balancer)."""
        if self._agent is not None:
            self._agent.drain()
        self.draining = True

    def _on_call(self, leg: CallLeg, *, lead_frames: int | None = None) -> None:
        """Run one call (a SIP engine's leg, or a browser's with its larger cushion in `lead_frames`)."""
        task: asyncio.Task[object] = asyncio.create_task(
            self._run_call(leg, lead_frames), name=leg.identity.call_id
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_call_task(self, coro: Coroutine[Any, Any, object], name: str) -> None:
        task: asyncio.Task[object] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_call(self, leg: CallLeg, lead_frames: int | None = None) -> None:
        app, identity = self.application, leg.identity
        try:
            setup = await app.setup(identity)
        except CallRefused as refused:  # issue 15: e.g. no config route for the called number (404)
            log.info("call %s: refused %d: %s", identity.call_id, refused.status, refused.reason)
            leg.hangup(refused.reason, status=refused.status)
            self.observer.call_refused(None, refused.status)
            return
        except Exception:
            log.exception("call %s: the application's setup failed; answering 500", identity.call_id)
            leg.hangup("application setup failed", status=500)
            self.observer.call_refused(None, 500)  # issue 15
            return
        telephony = self.config.telephony
        settings = SessionSettings(
            instructions=setup.instructions or self.config.instructions,
            voice=setup.voice,
            tools=setup.tools + tool_specs(telephony),
            history=setup.history,
            turn_detection=self.config.turn_detection,
        )
        choice = replace(self._choice, settings=settings)

        def reconnect(token: int, seeded: SessionSettings) -> Provider:
            return replace(choice, settings=seeded).connect(token)

        holder: list[LiveCall] = []
        session = CallSession(
            leg,
            choice.connect(token=1),
            reconnect=reconnect,
            settings=settings,
            failure_message=self.config.failure_message,
            options=CoordinatorOptions(rollover=self._rollover)
            if lead_frames is None
            else CoordinatorOptions(rollover=self._rollover, lead_frames=lead_frames),
            job_handler=lambda job: app.job(holder[0], job),
            approve=lambda rollover_id: app.approve_rollover(holder[0], rollover_id),
            authorize=app.authorize,
            telephony_options=telephony,
            dtmf_handler=lambda digit: app.dtmf(holder[0], digit),
            notice_sink=self.observer.tee(self.console.notice),
        )
        call = LiveCall(identity, session)
        holder.append(call)
        self.calls[identity.call_id] = call
        self._sessions[identity.call_id] = session
        self.observer.call_started(setup.route)
        summary: CallSummary | None = None
        if setup.greeting:  # issue 15: the model speaks first (bridge/greeting.py)
            self._on_call_task(greet(call, setup.greeting), f"{identity.call_id}-greeting")
        try:
            summary = await session.run()
            try:
                await app.ended(call, summary)
            except Exception:
                log.exception("call %s: the application's ended() failed", identity.call_id)
        finally:
            self.calls.pop(identity.call_id, None)
            self._sessions.pop(identity.call_id, None)
            self.observer.call_ended(setup.route, summary, leg)
            self.calls_changed.set()


def _engine_config(config: ServerConfig) -> EngineConfig:
    """What the SIP engine is told of the server's configuration."""
    host, port = config.sip
    return EngineConfig(
        host=host,
        port=port,
        rtp_port=config.rtp_port,
        max_calls=config.max_calls,
        allow=config.allow,
        drop_unknown=config.drop_unknown,
        inbound_auth=config.inbound_auth,
        invite_rate_per_s=config.invite_rate_per_s,
        register=config.register,
        auth_user=config.auth_user,
        register_password=config.register_password,
        external_address=config.external_address,
        nat=config.nat,
        tls=config.tls,
        cert=config.cert,
        tls_key=config.tls_key,
        tls_ca=config.tls_ca,
        srtp=config.srtp,
        max_call_duration_s=config.max_call_duration_s,
        rtp_timeout_s=config.rtp_timeout_s,
    )


def _provider_plan(config: ServerConfig) -> tuple[ProviderChoice, RolloverOptions | None]:
    """The provider every call connects to and the rollover options scaled from its cap; ValueError for a key
    that is missing or a turn mode the provider cannot do."""
    embedded = config.provider == "echo"
    kind = KINDS["openai-live" if embedded else config.provider]
    key = ECHO_LOCAL_KEY if embedded else config.key
    if key is None:
        raise ValueError(f"provider {kind.name} needs an API key")
    client_turns = config.turn_detection == "client"
    if client_turns and not kind.client_commits():
        raise ValueError(
            f"provider {kind.name} cannot switch turn detection off (turn detection 'client' "
            "needs openai-realtime or xai)"
        )
    choice = ProviderChoice(
        kind, key, config.provider_url, SessionSettings(), config.limits, config.provider_options
    )
    rollover = config.rollover
    options = (
        RolloverOptions.for_cap(kind.session_cap_ms) if isinstance(rollover, str) else rollover
    )  # "default"
    if options is not None and options.client_commits != client_turns:
        options = replace(options, client_commits=client_turns)  # RO5 follows the turn mode
    return choice, options
