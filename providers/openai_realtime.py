"""OpenAI Realtime GA adapter (shared/reference/providers.md §1): the Realtime-family core in OpenAI's dialect.

Endpoint `wss://api.openai.com/v1/realtime?model=gpt-realtime-2`, `Authorization: Bearer`, and no `OpenAI-Beta`
header (the beta shape is retired: close 4000). The GA `session.update` needs `session.type: "realtime"` and
nests voice and turn detection under `audio`; G.711 formats carry no rate. Input transcripts arrive as
`.delta` fragments and a `.completed` text; usage is tokens per response; barge-in is a response cancelled
with reason `turn_detected`, and what the caller actually heard is reported back with
`conversation.item.truncate`. With turn detection off (`turn_detection: null`) a commit is answered only after
a `response.create`. The 60-minute cap arrives as an `error` `session_expired` then close 1001.

Language (providers/language.py): the call's language as ISO 639-1 in `audio.input.transcription.language`,
and "Speak German (de-DE)." at the end of the instructions (GA has no output-language field).
"""

from __future__ import annotations

import logging

from providers.base import Capabilities
from providers.limits import OPENAI_REALTIME, AudioLimits
from providers.realtime_family import Dialect, RealtimeAdapter, token_usage
from rtp.audio import AudioFormat

DEFAULT_MODEL = "gpt-realtime-2"

DIALECT = Dialect(
    name="openai-realtime",
    default_url="wss://api.openai.com/v1/realtime",
    default_model=DEFAULT_MODEL,
    default_voice="marin",
    # Not on the 2027-02-26 retirement list that names whisper-1 and the gpt-4o-*-transcribe models.
    transcription_model="gpt-live-transcribe",
    transcription_language="language",  # ISO 639-1 (§1.3)
    session_type="realtime",
    nested_audio_settings=True,
    format_with_rate=False,
    session_update_after=frozenset({"session.created"}),
    input_transcript_partial="delta",
    cumulative_input_transcripts=False,
    text_event_prefix="response.output_text",
    assistant_text_type="output_text",
    commit_answers=False,
    supports_truncate=True,
    usage=token_usage,
)


class OpenAIRealtimeAdapter(RealtimeAdapter):
    """OpenAI Realtime GA as a `providers.base.Provider`."""

    name = "openai-realtime"
    capabilities = Capabilities(
        server_vad=True,
        speech_end_events=True,
        timed_captions=True,
        truncate=True,
        client_commits=True,
        response_events=True,
        append_frames=2,
    )
    dialect = DIALECT
    log = logging.getLogger("parlora.providers.openai_realtime")

    @staticmethod
    def audio_limits(fmt: AudioFormat) -> AudioLimits:
        """Realtime GA bursts faster than real time, like xAI: 20 s of capacity, a 21 s residence (DESIGN §5)."""
        return OPENAI_REALTIME.for_format(fmt)
