"""Google Gemini Live adapter (shared/reference/providers.md §2): a sans-I/O client core and a thin shell.

The client sends `setup` first and waits for `setupComplete`. Caller audio (8 kHz PCM16) is resampled to
16 kHz with PyAV and streamed as `realtimeInput.audio`; the service's own voice activity detection takes turns
and interrupts itself on barge-in (`serverContent.interrupted`). Assistant audio arrives as 24 kHz PCM16 in
`serverContent.modelTurn.parts[].inlineData` and is passed on exactly as received. There are no error events:
the service ends a connection with a close code (1007 invalid argument, 1008 policy / not found, 1011
internal or deadline) and a reason, and rotates connections every ~10 min with `goAway` then 1011.

`GeminiClientProtocol` turns server frames into `providers.events` and never raises on peer input: a frame it
cannot understand becomes a non-fatal `ProviderError` carrying the raw frame; invalid audio (bad base64, an
odd PCM16 length, another rate) is fatal (HR1).

Keepalive: Gemini's WebSocket pong can take 8-30 s, and websockets' default 20 s ping timeout then kills a
healthy connection with 1011 "keepalive ping timeout". The adapter pings every 20 s but waits 60 s for the pong
(PING_INTERVAL_S, PING_TIMEOUT_S); `Capabilities.answer_within_ms` lets the engine notice a dead one sooner.

Context: `contextWindowCompression.slidingWindow` is on by default, so a call may outlive the 15 min audio
session cap; connection rotation (goAway -> `SessionExpiring`, then `sessionResumptionUpdate` handles ->
`ResumptionUpdated`) is the engine's business, never this adapter's. The engine resumes by opening a new
adapter with `SessionSettings.resume_handle`: it goes in `setup.sessionResumption.handle`, no history is
seeded (the service keeps the conversation), and a refusal of the handle (close 1007 for an unknown or expired
handle, 1011 while the session's old socket is still open: §2.10) is `ResumptionRejected`, so the engine can
open a reseeded connection instead.

Language: the call's language (`SessionSettings.language`, BCP 47) goes in
`generationConfig.speechConfig.languageCode` as one of the codes Google lists for the Live API ("de" becomes
"de-DE"; providers/language.py `GEMINI_LANGUAGES`), and, because Google documents that native-audio models
ignore that field and take their language from the system instruction, also as its last line: "Speak German
(de-DE).". A language the list lacks, or a bare one with several listed codes ("en": en-US or en-IN), is
refused (ValueError) when the adapter is configured.

Caller turns: the service's automatic activity detection ends them; `commit_input()` sends `audioStreamEnd`,
which makes it end the current one now (RO2's commit at the hard stop). Client turn detection is not offered.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import ssl as ssl_module
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from providers.base import Capabilities, ProviderUnavailable, ResumptionRejected, SessionSettings, ToolSpec
from providers.batching import DEFAULT_APPEND_MS, PAIRED_APPEND_MS, adapter_batcher
from providers.events import (
    AudioReceived,
    InputTranscript,
    OutputInterrupted,
    OutputTranscript,
    ProviderError,
    ProviderEvent,
    ResponseDone,
    ResumptionUpdated,
    SessionClosed,
    SessionExpiring,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallCancelled,
    ToolCallRequested,
    UsageUpdated,
)
from providers.language import gemini_language_code, with_speak_line
from providers.limits import GEMINI_LIVE, AudioLimits, require_limits
from providers.ws_shell import WebSocketShell, WireTapFactory
from rtp.audio import PCM16_24K, AudioFormat
from rtp.resample import Resampler

log = logging.getLogger("parlora.providers.gemini_live")

DEFAULT_MODEL = "gemini-3.1-flash-live-preview"
DEFAULT_VOICE = "Puck"
DEFAULT_HOST = "generativelanguage.googleapis.com"
INPUT_RATE = 16_000
OUTPUT_MIME = "audio/pcm;rate=24000"
RAW_LOG_LIMIT = 2000  # characters of an offending frame kept for the log
PING_INTERVAL_S = 20.0
PING_TIMEOUT_S = 60.0  # Gemini's pong may take 8-30 s (module docstring)
_DURATION = re.compile(r"^(\d+)(?:\.(\d{1,9}))?s$")
_CLOSE_LABELS = {1000: "closed", 1007: "invalid_argument", 1008: "policy_violation", 1011: "internal_error"}
# How the service refuses `sessionResumption.handle` in answer to setup (§2.10): 1007 for a handle it does not
# know or no longer honours (expired), 1011 while the session's previous socket is still open. Either way a
# connection without the handle (reseeded) is what works; 1008 (policy, model, key) would refuse that too.
RESUMPTION_REFUSED = frozenset({1007, 1011})


def default_path(api_version: str = "v1beta") -> str:
    return f"/ws/google.ai.generativelanguage.{api_version}.GenerativeService.BidiGenerateContent"


def resolve_url(url: str | None, api_version: str = "v1beta") -> str:
    """The endpoint: the default, or `url` with the default path when it names only a scheme and host."""
    if not url:
        return f"wss://{DEFAULT_HOST}{default_path(api_version)}"
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path=default_path(api_version))
    return urlunsplit(parts)


@dataclass(frozen=True, slots=True)
class GeminiConfig:
    """What `setup` says; immutable for the life of a connection."""

    model: str = DEFAULT_MODEL
    voice: str = DEFAULT_VOICE
    instructions: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    history: tuple[tuple[str, str], ...] = ()
    resume_handle: str | None = None  # `sessionResumption.handle`: continue that session (no history seeded)
    compression: bool = True
    trigger_tokens: int | None = None  # None: the service's default (80 % of the context window)
    target_tokens: int | None = None  # None: the service's default (half the trigger)
    interrupts: bool = True  # START_OF_ACTIVITY_INTERRUPTS; False is NO_INTERRUPTION
    language: str | None = None  # BCP 47: `speechConfig.languageCode` and a line of the instructions

    def __post_init__(self) -> None:
        if self.language:
            gemini_language_code(self.language)  # ValueError at once, not a 1007 from the service

    @classmethod
    def from_settings(
        cls, settings: SessionSettings, *, model: str | None = None, **overrides: Any
    ) -> GeminiConfig:
        return cls(
            model=model or settings.model or DEFAULT_MODEL,
            voice=settings.voice or DEFAULT_VOICE,
            instructions=settings.instructions,
            tools=settings.tools,
            history=settings.history,
            resume_handle=settings.resume_handle,
            language=settings.language,
            **overrides,
        )


def setup_frame(config: GeminiConfig) -> dict[str, Any]:
    """The `setup` client message for `config` (canonical camelCase)."""
    model = config.model if config.model.startswith("models/") else f"models/{config.model}"
    speech: dict[str, Any] = {"voiceConfig": {"prebuiltVoiceConfig": {"voiceName": config.voice}}}
    if config.language:
        speech["languageCode"] = gemini_language_code(config.language)
    setup: dict[str, Any] = {
        "model": model,
        "generationConfig": {"responseModalities": ["AUDIO"], "speechConfig": speech},
    }
    instructions = with_speak_line(config.instructions, config.language)
    if instructions:
        setup["systemInstruction"] = {"parts": [{"text": instructions}]}
    if config.tools:
        setup["tools"] = [
            {
                "functionDeclarations": [
                    {"name": t.name, "description": t.description, "parametersJsonSchema": t.parameters}
                    for t in config.tools
                ]
            }
        ]
    setup["realtimeInputConfig"] = {
        "automaticActivityDetection": {"disabled": False},
        "activityHandling": "START_OF_ACTIVITY_INTERRUPTS" if config.interrupts else "NO_INTERRUPTION",
    }
    setup["inputAudioTranscription"] = {}
    setup["outputAudioTranscription"] = {}
    setup["sessionResumption"] = {"handle": config.resume_handle} if config.resume_handle else {}
    if config.compression:
        window: dict[str, Any] = {}
        if config.target_tokens is not None:
            window["targetTokens"] = config.target_tokens
        compression: dict[str, Any] = {"slidingWindow": window}
        if config.trigger_tokens is not None:
            compression["triggerTokens"] = config.trigger_tokens
        setup["contextWindowCompression"] = compression
    return {"setup": setup}


def parse_duration_ms(text: object) -> int | None:
    """A proto3 JSON Duration ("50s", "1.500s") in ms, or None."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    return int(match[1]) * 1000 + int((match[2] or "0").ljust(9, "0")[:3])


def _b64decode(data: str) -> bytes:
    """Strict base64 (proto3 JSON bytes: the standard or the URL-safe alphabet, padded)."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return base64.b64decode(data, altchars=b"-_", validate=True)


_AUDIO_HEAD = b'{"realtimeInput":{"audio":{"data":"'
_AUDIO_TAIL = b'","mimeType":"audio/pcm;rate=16000"}}}'


class GeminiClientProtocol:
    """The client side of one Gemini Live connection, without I/O. `token` tags every event it produces.

    Inputs: `receive_text` (server frames) and commands. Outputs: the returned events and the frames pulled
    with `frames_to_send()` (the setup frame first). Audio frames are returned by `audio_frame`, not queued,
    so the shell can drop them under back-pressure.
    """

    def __init__(self, config: GeminiConfig, token: int = 1) -> None:
        self.config = config
        self.token = token
        self.started = False
        self.closed = False  # Gemini never says so; the socket closing ends the session
        self.session_id = ""
        self.go_away_ms: int | None = None  # timeLeft of the goAway received, if any
        self.resumption_handle: str | None = config.resume_handle  # the latest resumable handle
        self.close_requested = False
        self._audio_open = False  # audio sent since the last `audioStreamEnd`
        self._heard: list[str] = []  # input transcription chunks of the caller's current utterance
        self.bytes_received = 0
        self._speech = False  # SpeechStarted already reported for the current activity
        self._interrupted = False  # the open turn was interrupted
        self._outgoing: list[str] = [self._frame(setup_frame(config))]

    # -- commands -------------------------------------------------------------------------------------------

    def frames_to_send(self) -> list[str]:
        frames, self._outgoing = self._outgoing, []
        return frames

    def close_frames(self) -> list[str]:
        return []  # no goodbye message: closing the socket ends the session

    @staticmethod
    def audio_frame(pcm16_16k: bytes) -> bytes:
        """A `realtimeInput.audio` frame (UTF-8) for 16 kHz PCM16LE: base64 needs no JSON escaping, so the frame
        is built as the bytes that go on the wire (no str to decode and encode again on the media path)."""
        return _AUDIO_HEAD + binascii.b2a_base64(pcm16_16k, newline=False) + _AUDIO_TAIL

    def stream_audio(self, pcm16_16k: bytes) -> bytes:
        """`audio_frame`, noting that the audio stream is open (it has something `commit_input` may end)."""
        self._audio_open = True
        return self.audio_frame(pcm16_16k)

    def commit_input(self) -> None:
        """`realtimeInput.audioStreamEnd` (§2.4): Gemini's equivalent of a commit under automatic activity
        detection. The service flushes the audio it holds and ends the caller's activity, so what the caller
        said is transcribed and answered now (RO2 at the hard stop); the next audio reopens the stream. Nothing
        when no audio was sent since the last one."""
        if self._audio_open:
            self._audio_open = False
            self._outgoing.append(self._frame({"realtimeInput": {"audioStreamEnd": True}}))

    def send_tool_result(self, call_id: str, name: str, output: str) -> None:
        """A `toolResponse`; a JSON `output` goes as its value, anything else as a string."""
        try:
            value: Any = json.loads(output)
        except ValueError:
            value = output
        response = {"id": call_id, "name": name, "response": {"output": value}}
        self._outgoing.append(self._frame({"toolResponse": {"functionResponses": [response]}}))

    def send_text(self, text: str, *, speak: bool) -> None:
        """A user turn of text in `clientContent`; `speak` completes the turn so the model answers."""
        turn = {"role": "user", "parts": [{"text": text}]}
        self._outgoing.append(self._frame({"clientContent": {"turns": [turn], "turnComplete": speak}}))

    def seed_history(self) -> None:
        """`clientContent` with the configured history (not on a resumed session: it has its own)."""
        if not self.config.history or self.config.resume_handle:
            return
        turns = [
            {"role": "model" if role in ("assistant", "model") else "user", "parts": [{"text": text}]}
            for role, text in self.config.history
        ]
        self._outgoing.append(self._frame({"clientContent": {"turns": turns, "turnComplete": False}}))

    @staticmethod
    def _frame(message: dict[str, Any]) -> str:
        return orjson.dumps(message).decode()

    # -- server frames --------------------------------------------------------------------------------------

    def receive_text(self, text: str | bytes) -> list[ProviderEvent]:
        """Events for one server frame. Never raises."""
        try:
            message = orjson.loads(text)
            if not isinstance(message, dict):
                raise ValueError("not a JSON object")
            return self._dispatch(message, text)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return [self._error("invalid_event", f"unparseable server message: {exc}", text, fatal=False)]

    def _dispatch(self, message: dict[str, Any], raw: str | bytes) -> list[ProviderEvent]:
        events: list[ProviderEvent] = []
        if "setupComplete" in message:
            self.started = True
            self.session_id = str((message["setupComplete"] or {}).get("sessionId", ""))
            events.append(SessionStarted(self.token, self.session_id))
            self.seed_history()
        if "serverContent" in message:
            if self._content(message["serverContent"], raw, events):
                return events  # fatal: nothing after invalid audio counts
        if "toolCall" in message:
            for call in message["toolCall"].get("functionCalls") or []:
                if not isinstance(call.get("id"), str) or not isinstance(call.get("name"), str):
                    events.append(
                        self._error(
                            "invalid_tool_call", "a function call without id or name", raw, fatal=False
                        )
                    )
                    continue
                args = call.get("args") or {}
                events.append(ToolCallRequested(self.token, call["id"], call["name"], json.dumps(args)))
        if "toolCallCancellation" in message:
            ids = tuple(str(i) for i in message["toolCallCancellation"].get("ids") or ())
            events.append(ToolCallCancelled(self.token, ids))
        if "usageMetadata" in message:
            usage = message["usageMetadata"]
            events.append(
                UsageUpdated(
                    self.token,
                    input_tokens=_count(usage.get("promptTokenCount")),
                    output_tokens=_count(usage.get("responseTokenCount")),
                    cumulative=True,
                )
            )
        if "goAway" in message:
            left = parse_duration_ms((message["goAway"] or {}).get("timeLeft"))
            self.go_away_ms = 0 if left is None else left
            events.append(SessionExpiring(self.token, self.go_away_ms, "go_away"))
        if "sessionResumptionUpdate" in message:
            update = message["sessionResumptionUpdate"] or {}
            handle, resumable = str(update.get("newHandle") or ""), update.get("resumable") is True
            if resumable and handle:
                self.resumption_handle = handle
            events.append(ResumptionUpdated(self.token, handle, resumable and bool(handle)))
        if "voiceActivity" in message:
            kind = (message["voiceActivity"] or {}).get("type")
            if kind == "ACTIVITY_START" and not self._speech:
                self._speech = True
                events.append(SpeechStarted(self.token))
            elif kind == "ACTIVITY_END":
                self._speech = False
                events.append(SpeechStopped(self.token))
        return events

    def _content(self, content: dict[str, Any], raw: str | bytes, events: list[ProviderEvent]) -> bool:
        """serverContent into events; True when it held invalid audio (a fatal error was appended)."""
        if content.get("interrupted") is True:
            # The caller spoke over the model: it has stopped, and what it sent must not be played.
            if not self._speech:
                self._speech = True
                events.append(SpeechStarted(self.token))
            self._interrupted = True
            events.append(OutputInterrupted(self.token))
        turn = content.get("modelTurn")
        if turn is not None:
            for part in turn.get("parts") or []:
                blob = part.get("inlineData")
                if blob is None or part.get("thought"):
                    continue  # text or thoughts: not for the caller's ear
                audio = self._audio(blob, raw)
                if isinstance(audio, ProviderError):
                    events.append(audio)
                    if audio.fatal:
                        return True
                    continue
                if audio is not None:
                    events.append(audio)
        for key, kind in (("inputTranscription", InputTranscript), ("outputTranscription", OutputTranscript)):
            chunk = content.get(key)
            if chunk is None:
                continue
            text, final = str(chunk.get("text") or ""), chunk.get("finished") is True
            if kind is InputTranscript:
                # Chunks are fragments to append; the finished one closes the utterance, and a final
                # InputTranscript is the utterance's complete text (providers/events.py).
                self._heard.append(text)
                if final:
                    text, self._heard = "".join(self._heard), []
            if text or final:
                events.append(kind(self.token, text, final=final))
        if content.get("turnComplete") is True:
            status = "cancelled" if self._interrupted else "completed"
            self._interrupted = self._speech = False
            events.append(ResponseDone(self.token, status=status))
        return False

    def _audio(self, blob: dict[str, Any], raw: str | bytes) -> ProviderEvent | None:
        mime = blob.get("mimeType", "")
        if not isinstance(mime, str):  # a broken part is a counted protocol error, not skipped
            return self._error("invalid_event", "inlineData.mimeType is not a string", raw, fatal=False)
        mime = mime.replace(" ", "").lower()
        if not mime.startswith("audio/"):
            return None  # not audio (an image or a file part): nothing to play
        if mime != OUTPUT_MIME:
            return self._error("invalid_audio", f"unexpected output audio format {mime!r}", raw, fatal=True)
        data = blob.get("data", "")
        try:
            if not isinstance(data, str):
                raise ValueError("not a string")
            audio = _b64decode(data)
        except (binascii.Error, ValueError):
            return self._error("invalid_audio", "output audio is not valid base64", raw, fatal=True)
        if len(audio) % 2:
            message = f"PCM16 output audio has an odd length ({len(audio)} bytes)"
            return self._error("invalid_audio", message, raw, fatal=True)
        if not audio:
            return None
        self.bytes_received += len(audio)
        return AudioReceived(self.token, audio, PCM16_24K)

    def connection_closed(self, code: int | None, detail: str) -> SessionClosed:
        """The socket closed with `code`: a session end, labelled (a 1011 after goAway is the expected one)."""
        if self.close_requested:
            label = "close_requested"
        elif code == 1011 and self.go_away_ms is not None:
            label = "go_away"
        else:
            label = _CLOSE_LABELS.get(code or 0, "connection_lost")
        self.closed = True
        return SessionClosed(self.token, f"{label}: {detail}", False, close_code=code)

    def _error(self, code: str, message: str, raw: object, *, fatal: bool) -> ProviderError:
        return ProviderError(self.token, code, message, fatal=fatal, raw=_clip(raw))


def _count(value: object) -> int | None:
    if not isinstance(value, (int, str)) or isinstance(value, bool):
        return None
    try:
        return int(value)  # int64 may come as a string in proto3 JSON
    except ValueError:
        return None


def _clip(raw: object) -> str:
    text = (
        raw
        if isinstance(raw, str)
        else raw.decode("utf-8", "replace")
        if isinstance(raw, bytes)
        else json.dumps(raw)
    )
    return text if len(text) <= RAW_LOG_LIMIT else text[:RAW_LOG_LIMIT] + "..."


class GeminiLiveAdapter:
    """Gemini Live as a `providers.base.Provider`: the client core inside a `WebSocketShell`."""

    name = "gemini-live"
    capabilities = Capabilities(
        server_vad=True,
        speech_end_events=False,
        timed_captions=False,
        truncate=False,
        resumption=True,
        answer_within_ms=6_000,
        response_events=True,
        append_frames=2,
        wide_input=True,
    )

    def __init__(
        self,
        api_key: str,
        settings: SessionSettings,
        *,
        limits: AudioLimits | None,
        url: str | None = None,
        token: int = 1,
        connect_timeout: float = 10.0,
        model: str | None = None,
        api_version: str = "v1beta",
        ssl_context: ssl_module.SSLContext | None = None,
        wire_tap: WireTapFactory | None = None,
        append_ms: int = DEFAULT_APPEND_MS,
    ) -> None:
        """`model` wins over `settings.model`; the default is DEFAULT_MODEL. `settings.resume_handle` resumes
        that session (the service keeps its history, so none is seeded). `append_ms`: caller audio per
        `realtimeInput.audio` (providers/batching.py)."""
        if settings.turn_detection == "client":
            raise ValueError(
                "gemini-live: the bridge keeps Gemini's automatic activity detection on "
                "(turn_detection='client' is for providers with client_commits)"
            )
        self._limits = require_limits(limits, type(self).__name__)
        config = GeminiConfig.from_settings(settings, model=model)
        self.core = GeminiClientProtocol(config, token)
        self.token = token
        self.url = resolve_url(url, api_version)
        if ssl_context is None and self.url.startswith("wss:"):
            ssl_context = (
                ssl_module.create_default_context()
            )  # the shell would pass ssl=None, which wss refuses
        self._resampler = Resampler(8000, INPUT_RATE)
        # 16 kHz PCM16: 32 B/ms
        self._batch = adapter_batcher(append_ms, 32)
        if (
            append_ms != PAIRED_APPEND_MS
        ):  # each frame alone, or its own batcher gathers them (providers/batching.py)
            self.capabilities = replace(self.capabilities, append_frames=1)
        self._closer: asyncio.Task[None] | None = None
        self.shell = WebSocketShell(
            self.core,
            self.url,
            {"x-goog-api-key": api_key},
            log=log,
            ssl=ssl_context,
            connect_timeout=connect_timeout,
            ping_interval=PING_INTERVAL_S,
            ping_timeout=PING_TIMEOUT_S,
            wire_tap=wire_tap,
        )

    @staticmethod
    def check_language(tag: str) -> None:
        """ValueError unless `tag` is (or is a bare language of exactly) one listed code (module docstring)."""
        gemini_language_code(tag)

    @staticmethod
    def audio_limits(fmt: AudioFormat) -> AudioLimits:
        """Gemini bursts its output: 10 s of capacity, an 11 s residence deadline (DESIGN §5)."""
        return GEMINI_LIVE.for_format(fmt)

    @property
    def output_format(self) -> AudioFormat:
        return PCM16_24K

    @property
    def limits(self) -> AudioLimits:
        return self._limits

    async def connect(self) -> SessionStarted:
        """Setup, then `setupComplete`; raises `ResumptionRejected` when the service closes instead of resuming
        `settings.resume_handle` (see RESUMPTION_REFUSED), `ProviderUnavailable` for any other failure."""
        try:
            started = await self.shell.connect()
        except ProviderUnavailable as exc:
            handle = self.core.config.resume_handle
            if handle and self.shell.handshake_close_code in RESUMPTION_REFUSED:
                raise ResumptionRejected(
                    f"resumption refused (close {self.shell.handshake_close_code}): {exc}"
                ) from None
            raise
        self.shell.flush()  # history seeded on setupComplete
        return started

    def send_audio(self, pcm16_8k: bytes, wide: bool = False) -> None:
        """16 kHz audio (`wide`: a G.722 leg, rtp.g722) is Gemini's own input rate and goes as it is; 8 kHz
        audio is resampled up."""
        pcm: bytes | None = pcm16_8k if wide else self._resampler.process(pcm16_8k)
        if pcm and self._batch is not None:
            pcm = self._batch.add(pcm)
        if pcm:
            self.shell.send_audio_frame(self.core.stream_audio(pcm))

    def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Gemini has no truncation: it assumes real-time playback and tracks interruptions itself."""

    def cancel_response(self) -> None:
        """Gemini has no cancel: it stops its own output when the caller speaks."""

    def commit_input(self) -> None:
        """`audioStreamEnd` after the audio already queued (see `GeminiClientProtocol.commit_input`)."""
        if self._batch is not None and (held := self._batch.take()):
            self.shell.send_audio_frame(self.core.stream_audio(held))  # the end follows all its audio
        self.core.commit_input()
        self.shell.flush()

    def send_tool_result(self, call_id: str, name: str, output: str) -> None:
        self.core.send_tool_result(call_id, name, output)
        self.shell.flush()

    def send_text(self, text: str, *, speak: bool = False) -> None:
        self.core.send_text(text, speak=speak)
        self.shell.flush()

    async def events(self) -> AsyncIterator[ProviderEvent]:
        async for event in self.shell.events():
            if isinstance(event, SessionClosed) and not event.finalized:
                event = self.core.connection_closed(event.close_code, event.reason)
            yield event

    def deliver_to(self, sink: Callable[[ProviderEvent], None]) -> None:
        def labelled(event: ProviderEvent) -> None:  # the socket's end, labelled as events() does
            if isinstance(event, SessionClosed) and not event.finalized:
                event = self.core.connection_closed(event.close_code, event.reason)
            sink(event)

        self.shell.deliver_to(labelled)

    def request_close(self) -> None:
        """No goodbye message exists: close the socket (a SessionClosed follows in events())."""
        if self._closer is None:
            self.core.close_requested = True
            self._closer = asyncio.get_running_loop().create_task(self.shell.close())

    async def close(self, timeout: float = 2.0) -> None:
        if self._closer is not None:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(self._closer)
            except TimeoutError:
                pass
        await self.shell.close(timeout)
