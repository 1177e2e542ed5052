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
import signal
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from bridge.console import ConsoleFeed, ConsoleHooks, poll_status
from bridge.coordinator import CoordinatorOptions
from bridge.delegations import JobRequest
from bridge.http import StatusServer
from bridge.providers import KINDS, ProviderChoice
from bridge.rollover import RolloverOptions
from bridge.session import CallSession, CallSummary
from bridge.telephony import TelephonyOptions, tool_specs
from providers.base import Provider, SessionSettings, ToolSpec
from providers.limits import LimitOverrides
from sip.engine import DEFAULT_ENGINE, EngineConfig, EngineError, SipEngine, create_engine
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
        self._browser: BrowserChannel | None = None  # imported (aiortc) only when the HTTP listener is on
        self._console_poll: asyncio.Task[None] | None = None
        embedded = config.provider == "echo"
        kind = KINDS["openai-live" if embedded else config.provider]
        self._embedded = embedded and config.provider_url is None
        key = ECHO_LOCAL_KEY if embedded else config.key
        if key is None:
            raise ValueError(f"provider {kind.name} needs an API key")
        client_turns = config.turn_detection == "client"
        if client_turns and not kind.client_commits():
            raise ValueError(f"provider {kind.name} cannot switch turn detection off (turn detection 'client' "
                             "needs openai-realtime or xai)")
        self._choice = ProviderChoice(kind, key, config.provider_url, SessionSettings(), config.limits,
                                      config.provider_options)
        rollover = config.rollover
        self._rollover: RolloverOptions | None = (
            RolloverOptions.for_cap(kind.session_cap_ms) if isinstance(rollover, str) else rollover)  # "default"
        if isinstance(self._rollover, RolloverOptions) and self._rollover.client_commits != client_turns:
            self._rollover = replace(self._rollover, client_commits=client_turns)  # RO5 follows the turn mode

    async def start(self) -> None:
        """Start the provider fake (echo), the status endpoint and the SIP engine; EngineError (e.g.
        EngineUnavailable naming the extra to install) if the engine cannot be built or start."""
        sip_host, sip_port = self.config.sip
        engine = create_engine(self.config.engine, EngineConfig(host=sip_host, port=sip_port,
                                                                rtp_port=self.config.rtp_port,
                                                                max_calls=self.config.max_calls), self._on_call)
        if self._embedded:
            from providers.fakes import openai_live as live_fake

            logging.getLogger("providers.fakes").setLevel(logging.WARNING)  # one connection per call: no chatter
            # Calls may last hours: the embedded fake keeps no per-frame record in memory.
            self._fake = await live_fake.serve("127.0.0.1", 0,
                                               options=live_fake.LiveFakeOptions(record_client_frames=False))
            self._choice = replace(self._choice, url=self._fake.url)
            log.info("provider: echo (embedded GPT-Live fake at %s)", self._fake.url)
        else:
            log.info("provider: %s at %s", self._choice.kind.name, self._choice.url or "the default endpoint")
        if self.config.http is not None:
            source = self._status_source
            talk = None
            if self.config.browser_channel:
                try:
                    from bridge.browser import BrowserChannel, BrowserLeg
                except ImportError as exc:  # aiortc is a dependency; a partial install still serves the console
                    log.warning("browser channel off (POST /talk answers 404): %s", exc)
                else:
                    def on_browser_call(leg: BrowserLeg) -> None:
                        self._on_call(leg, lead_frames=leg.lead_frames)

                    self._browser = BrowserChannel(on_browser_call)
                    talk = self._talk
            hooks = ConsoleHooks(self.console, self._hangup, talk)
            self._status = await StatusServer(source, console=hooks, token=self.config.http_token).start(
                *self.config.http)
            self._console_poll = asyncio.create_task(poll_status(self.console, source), name="console-poll")
            log.info("status on http://%s:%d/calls, console on http://%s:%d/", self.config.http[0],
                     self._status.port, self.config.http[0], self._status.port)
        self._agent = engine
        try:
            await engine.start()
        except EngineError:
            self._agent = None
            await self._close_helpers()
            raise

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
        """Start, serve until SIGINT or SIGTERM, stop; the process exit status."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            await self.start()
        except EngineError as exc:
            log.error("cannot start the SIP engine %s on %s:%d: %s", self.config.engine, *self.config.sip, exc)
            return 2
        await stop.wait()
        log.info("stopping")
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
            return lambda: {**session.status(), "channel": "browser" if browser else "sip",
                            "engine": "webrtc" if browser else engine}

        return {cid: tagged(s) for cid, s in self._sessions.items()}

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

    def _on_call(self, leg: CallLeg, *, lead_frames: int | None = None) -> None:
        """Run one call (a SIP engine's leg, or a browser's with its larger cushion in `lead_frames`)."""
        task: asyncio.Task[object] = asyncio.create_task(self._run_call(leg, lead_frames),
                                                         name=leg.identity.call_id)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_call(self, leg: CallLeg, lead_frames: int | None = None) -> None:
        app, identity = self.application, leg.identity
        try:
            setup = await app.setup(identity)
        except Exception:
            log.exception("call %s: the application's setup failed; answering 500", identity.call_id)
            leg.hangup("application setup failed", status=500)
            return
        telephony = self.config.telephony
        settings = SessionSettings(instructions=setup.instructions or self.config.instructions, voice=setup.voice,
                                   tools=setup.tools + tool_specs(telephony), history=setup.history,
                                   turn_detection=self.config.turn_detection)
        choice = replace(self._choice, settings=settings)

        def reconnect(token: int, seeded: SessionSettings) -> Provider:
            return replace(choice, settings=seeded).connect(token)

        holder: list[LiveCall] = []
        session = CallSession(
            leg, choice.connect(token=1), reconnect=reconnect, settings=settings,
            failure_message=self.config.failure_message,
            options=CoordinatorOptions(rollover=self._rollover) if lead_frames is None else
            CoordinatorOptions(rollover=self._rollover, lead_frames=lead_frames),
            job_handler=lambda job: app.job(holder[0], job),
            approve=lambda rollover_id: app.approve_rollover(holder[0], rollover_id),
            authorize=app.authorize, telephony_options=telephony,
            dtmf_handler=lambda digit: app.dtmf(holder[0], digit),
        )
        call = LiveCall(identity, session)
        holder.append(call)
        self.calls[identity.call_id] = call
        self._sessions[identity.call_id] = session
        try:
            summary = await session.run()
            try:
                await app.ended(call, summary)
            except Exception:
                log.exception("call %s: the application's ended() failed", identity.call_id)
        finally:
            self.calls.pop(identity.call_id, None)
            self._sessions.pop(identity.call_id, None)

