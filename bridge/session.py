"""One call's session shell: the call leg and one provider connection around a `SessionCoordinator`.

The shell only moves things: caller frames and provider events go into the coordinator with `now`; the
commands it pulls go to the provider; its notices go to the log; its one timer is re-armed after every input.
All rules live in bridge/coordinator.py.

The call rings (180) while the provider session starts and is answered (200) once it has; a provider that
cannot be reached gets the caller a 503 instead of a silent call. The session ends when either side does: a
caller BYE closes the provider session (waiting briefly for its final usage); a provider close or a fatal
protocol error hangs up the call with the reason logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bridge.coordinator import (
    ApproveRollover,
    AudioDiscontinuity,
    AuthorizeConnection,
    BargedIn,
    CancelResponse,
    CloseTransport,
    CommitInput,
    ConditionDetected,
    CoordinatorOptions,
    EndSession,
    OpenReplacement,
    OpenRollover,
    RecoveryChanged,
    RolloverChanged,
    SendAudio,
    SessionCoordinator,
    Transcript,
    Truncate,
    TurnEnded,
)
from bridge.delegations import CommandsUnknown, DeliverResult, DispatchJob, JobChanged, JobRequest, SendContext
from bridge.recovery import RECOVERY_NOTICE, RecoverySnapshot
from bridge import telephony
from bridge.telephony import TelephonyOptions
from bridge.reservoir import OutputOverflow
from providers.base import Provider, ProviderUnavailable, SessionSettings
from providers.events import ProviderError, ProviderEvent, SessionClosed, SessionStarted
from sip.leg import (
    CallEnded,
    CallLeg,
    DtmfReceived,
    FrameReceived,
    LegEvent,
    MediaHeld,
    MediaResumed,
    MediaStarted,
    TransferProgress,
)

log = logging.getLogger("parlora.session")

_LEG_DRAIN_TIMEOUT_S = 5.0
_SEEDED_HISTORY = 20  # messages of the application's history a replacement connection is seeded with (HR7)


def failure_tone() -> bytes:
    """The default closing message when a session fails: three short beeps (8 kHz PCM16)."""
    import numpy as np

    t = np.arange(1600) / 8000  # 200 ms
    beep = (6000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
    return (beep + bytes(1600)) * 3


def seeded_settings(original: SessionSettings, snapshot: RecoverySnapshot, *, notice: bool) -> SessionSettings:
    """HR7: the original instructions, a bounded part of the history, recent caller text and current facts;
    never the assistant's captions as heard messages; with `notice`, a fresh instruction to say what happened."""
    instructions = original.instructions or ""
    if notice:
        instructions = f"{instructions}\n\n{RECOVERY_NOTICE}".strip()
    history = list(original.history[-_SEEDED_HISTORY:])
    history += [("system", f"Verified fact: {fact}") for fact in snapshot.facts]
    history += [("user", text) for text in snapshot.caller_text]
    return SessionSettings(instructions=instructions, voice=original.voice, model=original.model,
                           tools=original.tools, history=tuple(history))


JobHandler = Callable[[JobRequest], Awaitable[str]]
"""The application's answer to a tool call or delegation: the output text (JSON or plain) for the model."""

ApproveHook = Callable[[str], Awaitable[bool]]
"""Called with the rollover id before a rollover opens the next connection; False or an exception refuses."""

AuthorizeHook = Callable[[str], Awaitable[bool]]
"""`connection_hooks.authorize`: called with a connection id ("<call id>/conn-N") before every connection is
opened — the first, rollovers and recovery replacements (RO7). False refuses that connection."""

_HOOK_TIMEOUT_S = 10.0


async def _allow(_: str) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class _ReplacementFailed:
    token: int
    reason: str


@dataclass(frozen=True, slots=True)
class _JobAnswered:
    job_id: str
    output: str


@dataclass(frozen=True, slots=True)
class _Approved:
    rollover_id: str
    approved: bool | None
    error: str | None


@dataclass(frozen=True, slots=True)
class _Authorized:
    connection_id: str
    ok: bool


@dataclass(frozen=True, slots=True)
class _RolloverFailed:
    token: int
    reason: str


class _Wake:
    """Something outside the loop changed the coordinator (an application push): carry out its commands."""


DtmfHandler = Callable[[str], Awaitable[None]]

_PROVIDER_CLOSE_TIMEOUT_S = 2.0  # how long a finished call waits for the provider's final usage


@dataclass(frozen=True, slots=True)
class CallSummary:
    """What the end-of-call log line says."""

    call_id: str
    duration_s: float
    frames_in: int
    frames_out: int
    ended_by: str  # "caller", "bridge" or "provider"
    reason: str
    usage_seconds: float | None


class CallSession:
    """Runs one call to completion. `run()` returns when the call leg has ended."""

    def __init__(
        self,
        leg: CallLeg,
        provider: Provider,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        options: CoordinatorOptions | None = None,
        reconnect: Callable[[int, SessionSettings], Provider] | None = None,
        settings: SessionSettings | None = None,
        failure_message: bytes | None = None,
        job_handler: JobHandler | None = None,
        approve: ApproveHook | None = None,
        authorize: AuthorizeHook | None = None,
        telephony_options: TelephonyOptions | None = None,
        dtmf_handler: DtmfHandler | None = None,
    ) -> None:
        self.leg = leg
        self.provider = provider
        self.providers: dict[int, Provider] = {provider.token: provider}
        self._reconnect = reconnect
        self._settings = settings or SessionSettings()
        self._failure_message = failure_message if failure_message is not None else failure_tone()
        self._job_handler = job_handler
        self._approve = approve or _allow
        self._authorize = authorize or _allow
        self._telephony = telephony_options or TelephonyOptions()
        self._dtmf_handler = dtmf_handler
        self._transfer_job: str | None = None  # the transfer_call job waiting for the transferee's answer
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._clock = clock
        self._options = options
        self.started_ns = clock()
        self.coordinator: SessionCoordinator | None = None
        self._ended: CallEnded | None = None
        self._end_reason = ""
        self._ended_by = ""
        self._provider_done = False
        self.frames_in = 0

    @property
    def call_id(self) -> str:
        return self.leg.identity.call_id

    def status(self) -> dict[str, Any]:
        """`status()` of the session (SE7): identity, state and the coordinator's view."""
        ident = self.leg.identity
        now = self._clock()
        body: dict[str, Any] = {
            "call_id": ident.call_id,
            "from": ident.from_uri,
            "to": ident.to_uri,
            "called": ident.request_user,
            "source": ident.source,
            "provider": self.provider.name,
            "duration_ms": (now - self.started_ns) // 1_000_000,
        }
        if self.coordinator is None:
            body["state"] = "closed" if self._ended else "connecting"
        else:
            body.update(self.coordinator.status(now))
            if self._ended is not None:
                body["state"] = "closed"
            elif self._provider_done and body["state"] != "failed":
                body["state"] = "closing"
        return body

    async def run(self) -> CallSummary:
        ident = self.leg.identity
        log.info("call %s started: from %s to %s (source %s)", ident.call_id, ident.from_uri, ident.to_uri, ident.source)
        try:
            if not await self._authorized(f"conn-{self.provider.token}"):
                raise ProviderUnavailable(f"connection {self.call_id}/conn-{self.provider.token} not authorised")
            started = await self.provider.connect()
        except ProviderUnavailable as exc:
            # Not answered yet: the caller gets 503 rather than a call that cannot talk.
            self._hangup("bridge", f"provider unavailable: {exc}")
            await self._drain_leg()
        else:
            self.coordinator = SessionCoordinator(
                limits=self.provider.limits,
                output_format=self.provider.output_format,
                capabilities=self.provider.capabilities,
                channel=self.leg,
                now=self.started_ns,
                token=self.provider.token,
                options=self._options,
            )
            self.coordinator.provider_event(started, self._clock())
            if started.expires_at:
                self._expires(started)
            self.leg.answer()
            await self._bridge()
        summary = self._summary()
        log.info(
            "call %s ended after %.2f s by %s (%s): frames in %d, out %d, provider usage %s",
            summary.call_id,
            summary.duration_s,
            summary.ended_by,
            summary.reason,
            summary.frames_in,
            summary.frames_out,
            "unknown" if summary.usage_seconds is None else f"{summary.usage_seconds:g} s",
        )
        return summary

    async def _bridge(self) -> None:
        assert self.coordinator is not None
        coordinator = self.coordinator
        self._inbox: asyncio.Queue[object] = asyncio.Queue()
        self._spawn("leg", _pump(self.leg.events(), self._inbox))
        self._spawn(f"provider-{self.provider.token}", _pump(self.provider.events(), self._inbox))
        loop = asyncio.get_running_loop()
        close_deadline: float | None = None
        try:
            while True:
                deadline = coordinator.next_deadline()
                now = self._clock()
                timeout = None if deadline is None else max(0.0, (deadline - now) / 1e9)
                if close_deadline is not None:
                    left = max(0.0, close_deadline - loop.time())
                    timeout = left if timeout is None else min(timeout, left)
                if close_deadline is not None and loop.time() >= close_deadline:
                    break
                if deadline is not None and deadline <= now:
                    coordinator.handle_timer(now)  # a due timer first, then one queued input: neither starves
                    if not self._inbox.empty():
                        self._handle(self._inbox.get_nowait())
                else:
                    try:
                        item = await asyncio.wait_for(self._inbox.get(), timeout)
                    except TimeoutError:
                        if close_deadline is None or loop.time() < close_deadline:
                            coordinator.handle_timer(self._clock())
                    else:
                        self._handle(item)
                await self._carry_out()
                if self._ended is not None and (self._provider_done or coordinator.ended or coordinator.recovery.reconnecting):
                    break  # (while reconnecting there is no session whose final usage could be waited for)
                if self._ended is not None and close_deadline is None:
                    self.provider.request_close()  # the call is over: ask for the final usage
                    close_deadline = loop.time() + _PROVIDER_CLOSE_TIMEOUT_S
                elif self._provider_done and close_deadline is None:
                    close_deadline = loop.time() + _LEG_DRAIN_TIMEOUT_S
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            await asyncio.gather(*(p.close(timeout=1.0) for p in self.providers.values()), return_exceptions=True)

    def _spawn(self, name: str, coro: Any) -> None:
        self._tasks[name] = asyncio.create_task(coro, name=f"{self.call_id}-{name}")

    def _handle(self, item: object) -> None:
        """Feed one input to the coordinator."""
        assert self.coordinator is not None
        now = self._clock()
        if isinstance(item, FrameReceived):
            self.frames_in += 1
            self.coordinator.caller_frame(item.pcm, now)
        elif isinstance(item, CallEnded):
            self._ended = item
            self.coordinator.call_ended()
            if item.by_remote:
                self._ended_by, self._end_reason = "caller", f"{item.status_code} {item.reason}"
            elif not self._ended_by:
                self._ended_by, self._end_reason = "bridge", item.reason
        elif isinstance(item, MediaStarted):
            log.info("call %s media: %s", self.call_id, item.codec)
        elif isinstance(item, DtmfReceived):
            log.info("call %s caller pressed %s", self.call_id, item.digit)
            if self._dtmf_handler is not None:
                self._spawn(f"dtmf-{self.frames_in}-{item.digit}", self._dtmf_handler(item.digit))
            if self._telephony.dtmf_to_model:
                self.coordinator.push_update(f"The caller pressed the key {item.digit} on their keypad.",
                                             speak=False, now=now)
        elif isinstance(item, TransferProgress):
            log.info("call %s transfer to %s: %d %s%s", self.call_id, item.target, item.status_code, item.reason,
                     " (final)" if item.final else "")
            if item.final and self._transfer_job is not None:
                ok = 200 <= item.status_code < 300
                self.coordinator.job_answered(self._transfer_job, telephony.result(
                    transferred=ok, status=item.status_code, reason=item.reason), now)
                self._transfer_job = None
        elif isinstance(item, (MediaHeld, MediaResumed)):
            log.info("call %s %s", self.call_id, item)  # not acted on yet
        elif isinstance(item, _ReplacementFailed):
            self.coordinator.replacement_failed(item.token, item.reason, now)
        elif isinstance(item, _Approved):
            self.coordinator.rollover_approved(item.rollover_id, item.approved, item.error, now)
        elif isinstance(item, _Authorized):
            self.coordinator.connection_authorized(item.connection_id, item.ok, now)
        elif isinstance(item, _RolloverFailed):
            self.coordinator.rollover_failed(item.token, item.reason, now)
        elif isinstance(item, _JobAnswered):
            if not self.coordinator.job_answered(item.job_id, item.output, now):
                log.info("call %s %s answered after it was withdrawn or superseded: not delivered", self.call_id,
                         item.job_id)
        elif isinstance(item, _Wake):
            pass  # the commands an application push produced are carried out next
        elif item is not None:  # a provider event (a reader that ended sends None)
            self.coordinator.provider_event(item, now)  # type: ignore[arg-type]
            if isinstance(item, SessionStarted) and item.expires_at:
                self._expires(item)

    async def _carry_out(self) -> None:
        assert self.coordinator is not None
        for command in self.coordinator.commands():
            if isinstance(command, SendAudio):
                if (target := self.providers.get(command.token)) is not None:
                    target.send_audio(command.pcm16_8k)
            elif isinstance(command, Truncate):
                self._current().truncate(command.item_id, command.audio_end_ms)
            elif isinstance(command, CancelResponse):
                self._current().cancel_response()
            elif isinstance(command, OpenReplacement):
                self._open_replacement(command)
            elif isinstance(command, CloseTransport):
                self._close_transport(command.token)
            elif isinstance(command, EndSession):
                await self._end_session(command)
            elif isinstance(command, DispatchJob):
                self._dispatch(command.request)
            elif isinstance(command, DeliverResult):
                if (provider := self.providers.get(command.token)) is not None:
                    provider.send_tool_result(command.call_id, command.name, command.output)
            elif isinstance(command, SendContext):
                if (provider := self.providers.get(command.token)) is not None:
                    provider.send_text(command.text, speak=command.speak)
            elif isinstance(command, ApproveRollover):
                self._spawn(f"approve-{command.rollover_id}", self._ask_approval(command.rollover_id))
            elif isinstance(command, AuthorizeConnection):
                self._spawn(f"authorize-{command.connection_id}", self._ask_authorization(command.connection_id))
            elif isinstance(command, OpenRollover):
                self._open_rollover(command)
            elif isinstance(command, CommitInput):
                commit = getattr(self.providers.get(command.token), "commit_input", None)
                if commit is not None:
                    commit()
        if self.coordinator.token in self.providers:
            self.provider = self.providers[self.coordinator.token]  # the connection holding the floor
        for notice in self.coordinator.notices():
            self._log_notice(notice)

    def _current(self) -> Provider:
        assert self.coordinator is not None
        return self.providers.get(self.coordinator.token, self.provider)

    def _open_replacement(self, command: OpenReplacement) -> None:
        """HR5: one passive replacement with a fresh handshake; it carries no caller audio until ready."""
        if self._reconnect is None:
            self._inbox.put_nowait(_ReplacementFailed(command.token, "no way to reconnect this provider"))
            return
        settings = seeded_settings(self._settings, command.snapshot, notice=True)
        provider = self._reconnect(command.token, settings)
        self.providers[command.token] = provider
        self._spawn(f"provider-{command.token}", self._connect_another(provider, _ReplacementFailed, authorize=True))

    async def _connect_another(self, provider: Provider, failed: type[_ReplacementFailed] | type[_RolloverFailed],
                               *, authorize: bool) -> None:
        """Open a further connection (a recovery replacement, or a rollover's next one, which was authorised
        before it was asked for) and feed its events to the inbox; a failure is reported as `failed`."""
        try:
            if authorize and not await self._authorized(f"conn-{provider.token}"):
                raise ProviderUnavailable(f"connection {self.call_id}/conn-{provider.token} not authorised")
            started = await provider.connect()
        except ProviderUnavailable as exc:
            self._inbox.put_nowait(failed(provider.token, str(exc)))
            return
        self._inbox.put_nowait(started)
        await _pump(provider.events(), self._inbox)

    # --- rollover (RO6-RO8): the hooks and the next connection ---

    async def _authorized(self, connection_id: str) -> bool:
        """RO7: every connection is authorised by its id ("<call id>/conn-N") before it is opened."""
        key = f"{self.call_id}/{connection_id}"
        try:
            return bool(await asyncio.wait_for(self._authorize(key), _HOOK_TIMEOUT_S))
        except Exception as exc:  # a failing hook refuses, it never crashes the call
            log.warning("call %s authorize(%s) failed: %r", self.call_id, key, exc)
            return False

    async def _ask_approval(self, rollover_id: str) -> None:
        try:
            approved: bool | None = bool(await self._approve(f"{self.call_id}/{rollover_id}"))
            error = None
        except Exception as exc:  # RO6: an exception is a refusal
            approved, error = False, repr(exc)
        self._inbox.put_nowait(_Approved(rollover_id, approved, error))

    async def _ask_authorization(self, connection_id: str) -> None:
        self._inbox.put_nowait(_Authorized(connection_id, await self._authorized(connection_id)))

    def _open_rollover(self, command: OpenRollover) -> None:
        """RO8: the next connection, seeded with context (no recovery notice); it listens until it takes the floor."""
        if self._reconnect is None:
            self._inbox.put_nowait(_RolloverFailed(command.token, "no way to open another connection"))
            return
        settings = seeded_settings(self._settings, command.snapshot, notice=False)
        provider = self._reconnect(command.token, settings)
        self.providers[command.token] = provider
        self._spawn(f"provider-{command.token}", self._connect_another(provider, _RolloverFailed, authorize=False))

    def _expires(self, started: SessionStarted) -> None:
        """`expires_at` (unix seconds) as time left, from the wall clock: the one place it is read."""
        assert self.coordinator is not None and started.expires_at is not None
        left_ms = int((started.expires_at - time.time()) * 1000)
        self.coordinator.connection_expires(started.token, left_ms, self._clock())

    def _dispatch(self, request: JobRequest) -> None:
        """Run the application's handler once for this job; its answer comes back through the inbox. The
        telephony tools (DL6) are carried out here, on the call leg."""
        if request.name in self._telephony.names:
            self._telephony_tool(request)
            return
        self._spawn(request.job_id, self._run_job(request))

    def _telephony_tool(self, request: JobRequest) -> None:
        assert self.coordinator is not None
        now = self._clock()
        if request.name == telephony.END_CALL:
            output = telephony.result(ok=True, note="Say a short goodbye now; the call ends when you finish.")
            self.coordinator.end_after_goodbye(now, self._telephony.goodbye_timeout_ms)
        elif request.name == telephony.TRANSFER_CALL:
            target = telephony.transfer_target(self._telephony, request.arguments)
            if target is None or self._transfer_job is not None:
                why = "a transfer is already in progress" if target else "unknown destination"
                output = telephony.result(transferred=False, error=why)
            else:
                self._transfer_job = request.job_id
                log.info("call %s transferring to %s (%s)", self.call_id, target[0], target[1])
                self.leg.transfer(target[1])
                return  # answered when the transferee's final status arrives
        else:
            digits = telephony.argument(request.arguments, "digits") or ""
            try:
                self.leg.send_dtmf(digits)
                output = telephony.result(sent=digits)
            except ValueError as exc:
                output = telephony.result(sent="", error=str(exc))
        self._inbox.put_nowait(_JobAnswered(request.job_id, output))

    # --- the application's pushes into a live call (DL3) ---

    def push_update(self, text: str, *, speak: bool = True) -> bool:
        """A speakable update (or silent context) for the model; held during a recovery until the caller has
        spoken again (HR9). False when the call is not live or the limit on command records is reached."""
        if self.coordinator is None or self.coordinator.ended:
            return False
        accepted = self.coordinator.push_update(text, speak=speak, now=self._clock())
        self._inbox.put_nowait(_Wake())
        return accepted

    def push_fact(self, text: str) -> None:
        """A task fact or verified result: kept for the seed of any later connection (HR7), never spoken."""
        if self.coordinator is not None:
            self.coordinator.push_fact(text)

    def push_result(self, job_id: str, output: str) -> bool:
        """A (new revision of a) result for a job, e.g. when the application finishes work later."""
        if self.coordinator is None:
            return False
        accepted = self.coordinator.job_answered(job_id, output, self._clock())
        self._inbox.put_nowait(_Wake())
        return accepted

    async def _run_job(self, request: JobRequest) -> None:
        if self._job_handler is None:
            output = '{"error": "no application handler is configured for tools"}'
        else:
            try:
                output = await self._job_handler(request)
            except Exception as exc:  # the application's failure is the model's answer, not the call's end
                log.warning("call %s %s (%s) failed in the application: %r", self.call_id, request.job_id,
                            request.name, exc)
                output = '{"error": "the application could not complete this request"}'
        self._inbox.put_nowait(_JobAnswered(request.job_id, output))

    def _close_transport(self, token: int) -> None:
        task = self._tasks.pop(f"provider-{token}", None)
        if task is not None:
            task.cancel()
        provider = self.providers.pop(token, None)
        if provider is not None:
            self._spawn(f"close-{token}", provider.close(timeout=1.0))

    async def _end_session(self, command: EndSession) -> None:
        self._provider_done = True
        if self._ended is not None:
            return
        if (command.failed or command.goodbye) and self.coordinator is not None:
            # The caller hears a short message, then BYE: never a silent line that just drops.
            ms = self.coordinator.play_final_message(self._failure_message)
            level = logging.ERROR if command.failed else logging.WARNING
            log.log(level, "call %s %s: %s; playing a %d ms message, then hanging up", self.call_id,
                    "failed" if command.failed else "ends", command.reason, ms)
            await asyncio.sleep(ms / 1000 + 0.1)
        self._hangup("provider", command.reason)

    def _log_notice(self, notice: object) -> None:
        cid = self.call_id
        if isinstance(notice, ConditionDetected):
            log.warning("call %s %s at %d ms: %s", cid, _condition_name(notice.condition), notice.at_ms, notice.condition)
        elif isinstance(notice, BargedIn):
            level = logging.INFO if notice.cleared_ms else logging.DEBUG
            reaction = "n/a" if notice.last_frame_ms is None else f"{notice.last_frame_ms:+.1f} ms"
            log.log(level, "call %s barge-in (%s) at %d ms: cleared %d ms of output; heard %s; last assistant frame "
                    "left %s from the event", cid, notice.source, notice.at_ms, notice.cleared_ms,
                    list(notice.heard) or "nothing interrupted", reaction)
        elif isinstance(notice, TurnEnded):
            log.debug("call %s caller turn ended at %d ms", cid, notice.at_ms)
        elif isinstance(notice, Transcript):
            if notice.role == "caller" and notice.final:  # each caller utterance once (RO3); its words at DEBUG
                log.info("call %s caller utterance at %d ms (%d characters)", cid, notice.at_ms, len(notice.text))
            log.debug("call %s %s (%d ms): %s", cid, notice.role, notice.at_ms, notice.text)
        elif isinstance(notice, ProviderError) and not notice.fatal:
            log.warning("call %s provider error %s: %s", cid, notice.code, notice.message)
        elif isinstance(notice, JobChanged):
            log.info("call %s %s (%s) %s at %d ms: %s", cid, notice.job_id, notice.name, notice.state, notice.at_ms,
                     notice.detail)
        elif isinstance(notice, CommandsUnknown):
            for record in notice.records:
                log.warning("call %s command %d (%s%s) on lost connection %d: unknown, not replayed", cid,
                            record.command_id, record.what, f" of {record.job_id}" if record.job_id else "",
                            notice.token)
        elif isinstance(notice, AudioDiscontinuity):
            unit = "bytes of provider audio" if notice.direction == "output" else "caller frames"
            log.warning("call %s audio_discontinuity %s: %d %s dropped (%s) at %d ms", cid, notice.direction,
                        notice.amount, unit, notice.cause, notice.at_ms)
        elif isinstance(notice, RolloverChanged):
            log.warning("call %s rollover %s: %s (%s) at %d ms", cid, notice.what, notice.connection_id, notice.detail,
                        notice.at_ms)
        elif isinstance(notice, RecoveryChanged):
            level = logging.ERROR if notice.stage == "failed" else logging.WARNING
            log.log(level, "call %s output_recovery %s: token %d, cause %s, %d ms since the condition", cid,
                    notice.stage, notice.token, notice.cause, notice.elapsed_ms)

    def _hangup(self, by: str, reason: str) -> None:
        if self._ended is None and not self._ended_by:
            self._ended_by, self._end_reason = by, reason
            log.warning("call %s: %s; hanging up", self.call_id, reason)
            self.leg.hangup(reason[:100])

    async def _drain_leg(self) -> None:
        try:
            async with asyncio.timeout(_LEG_DRAIN_TIMEOUT_S):
                async for event in self.leg.events():
                    if isinstance(event, CallEnded):
                        self._ended = event
        except TimeoutError:
            pass

    def _summary(self) -> CallSummary:
        ended = self._ended
        usage = self.coordinator.usage.audio_seconds if self.coordinator else None
        return CallSummary(
            call_id=self.call_id,
            duration_s=(self._clock() - self.started_ns) / 1e9,
            frames_in=self.frames_in,
            frames_out=self.leg.ledger.frames_transmitted,
            ended_by=self._ended_by or "unknown",
            reason=self._end_reason or (f"{ended.status_code} {ended.reason}" if ended else "unknown"),
            usage_seconds=usage,
        )


def _condition_name(condition: object) -> str:
    return "output_overflow" if isinstance(condition, OutputOverflow) else "output_stale"


async def _pump(source: AsyncIterator[Any], inbox: asyncio.Queue[Any]) -> None:
    async for item in source:
        inbox.put_nowait(item)
    inbox.put_nowait(None)
