"""xAI Grok Voice Agent adapter (shared/reference/providers.md §3): the Realtime-family core in xAI's dialect.

Endpoint `wss://api.x.ai/v1/realtime?model=grok-voice-think-fast-1.0`, `Authorization: Bearer`. xAI clones
OpenAI's GA event names with the differences of §3.6, each a field of `DIALECT`: `session.update` has no
`session.type` and puts `voice` and `turn_detection` at the top level of `session`; formats are `{type, rate}`;
the server may greet with `conversation.created` (older servers sent it first); input transcripts are whole
`.updated` snapshots (with `grok-transcribe`) and the `.completed` text is a snapshot too; text output is the
beta `response.text.*`; truncation is not supported (the model's context keeps what the caller did not hear);
usage is `billable_audio_seconds`, a running total for the conversation; with `turn_detection: null` the server
answers an `input_audio_buffer.commit` by itself (no `response.create`, which it would drop). The periodic
`ping` keepalive is an unknown event to the core and ignored.

Language (providers/language.py): the call's language as ISO 639-1 in `audio.input.transcription.language_hint`
(§3.3's name; the fake also takes OpenAI's `language`), and "Speak German (de-DE)." at the end of the
instructions (xAI has no output-language field).
"""

from __future__ import annotations

import logging

from providers.base import Capabilities
from providers.limits import XAI, AudioLimits
from providers.realtime_family import Dialect, RealtimeAdapter, billable_audio_usage
from rtp.audio import AudioFormat

DEFAULT_MODEL = "grok-voice-think-fast-1.0"

DIALECT = Dialect(
    name="xai",
    default_url="wss://api.x.ai/v1/realtime",
    default_model=DEFAULT_MODEL,
    default_voice="eve",
    transcription_model="grok-transcribe",
    transcription_language="language_hint",  # ISO 639-1 (§3.3)
    session_type=None,
    nested_audio_settings=False,
    format_with_rate=True,
    session_update_after=frozenset({"session.created", "conversation.created"}),
    input_transcript_partial="updated",
    cumulative_input_transcripts=True,
    text_event_prefix="response.text",
    assistant_text_type="output_text",
    commit_answers=True,
    supports_truncate=False,
    usage=billable_audio_usage,
)


class XAIAdapter(RealtimeAdapter):
    """xAI's Grok Voice Agent as a `providers.base.Provider`."""

    name = "xai"
    capabilities = Capabilities(
        server_vad=True,
        speech_end_events=True,
        timed_captions=True,
        truncate=False,
        client_commits=True,
        response_events=True,
        append_frames=2,
    )
    dialect = DIALECT
    log = logging.getLogger("parlora.providers.xai")

    @staticmethod
    def audio_limits(fmt: AudioFormat) -> AudioLimits:
        """xAI bursts faster than real time: 20 s of capacity, a 21 s residence deadline (DESIGN §5)."""
        return XAI.for_format(fmt)
