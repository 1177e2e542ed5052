"""Per-turn latency: when the caller's speech ended on the wire and when the provider's answer began to arrive.

A turn's four times, on the session timeline (ms):
- *speech end*: the end of the caller's last voiced audio as it came in on the wire. A provider's speech
  stopped event gives it as an offset in the audio that connection was sent (OpenAI `audio_end_ms`); the
  timeline's audio map (bridge/engine/timeline.py `Timeline.rebase`, the frame counter `fed`) turns that offset
  into the session time the frame holding it was forwarded, which is when it arrived from the carrier (the
  jitter buffer's delay aside). Where the local detector ends the turn (GPT-Live, Gemini), its stop comes
  `hangover_ms` of silence after the last voiced frame: the speech end is that frame's arrival, the stop's
  instant less the hangover (bridge/engine/turns.py `CallerStopped.ended_ns`). A provider end with no offset
  is taken at the instant it was reported (an upper bound).
- *first audio*: the arrival of the first audio delta of the answering item (bridge/engine/reservoir.py
  `OutputPath.on_item`, once per item, never per frame).
- *first frame out*: the first frame of that item handed to the carrier, read from the carrier ledger by the
  record (bridge/server/records.py): the ledger stamps it on the media clock, so nothing here runs per frame.
- *truncation*: on barge-in, how much of it had been transmitted (the ledger, `BargedIn.heard`).

The split: the provider's share is first audio − speech end; the bridge's is first frame out − first audio
(the reservoir, the framer, the cushion's lead and the media clock's next slot).

Choices where the rules are silent: a speech end is answered by the next item whose first audio arrives
after it, once; an item with none before it (a greeting, a reply after a tool result, the second item of a
reply) has no speech end and no provider share. A later speech end with no answer between replaces the
earlier one (the caller went on: they waited from their last words). A speech end survives a recovery: the
replacement's first words (its notice, HR7) are what the caller waited for, and the turn's kind says
"recovery". Across a rollover, an end the next connection heard (the hand-over, S3) is not answered by the
old floor's tail (RO2: it finishes the items it holds): tokens only grow, and an item of a connection older
than the one that heard the end answers none. The next connection's first words, and any answer to an end
another connection heard, are kind "rollover".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from bridge.engine.commands import Outbox, TurnTiming
from bridge.engine.timeline import Timeline

Kind = Literal["conversation", "recovery", "rollover"]


class TurnClock:
    """Times each assistant turn's start (the module docstring): speech ends in, `TurnTiming` notices out."""

    def __init__(
        self, out: Outbox, timeline: Timeline, floor: Callable[[], int], repairing: Callable[[int], bool]
    ) -> None:
        self._out, self._timeline, self._floor, self._repairing = out, timeline, floor, repairing
        self._speech_end: tuple[int, int] | None = None  # (session ms, the token that reported it)
        self._speaker = floor()  # the connection whose item was timed last

    def speech_ended(self, at_ms: int, token: int) -> None:
        """The caller's speech ended at `at_ms` (session ms on the wire), as connection `token` heard it."""
        self._speech_end = (at_ms, token)
        self._repair()

    def _repair(self) -> bool:
        """The floor is a recovery's replacement still repairing (then it is no rollover's next connection)."""
        floor = self._floor()
        if self._repairing(floor):
            self._speaker = floor
            return True
        return False

    def item_began(self, item_id: str, now: int) -> None:
        """The first audio of an item of the floor's arrived now (reservoir.py `OutputPath.on_item`)."""
        token, end = self._floor(), self._speech_end
        if end is not None and end[1] > token:
            end = (
                None  # an older connection's tail (a rollover's old floor finishing, RO2): the newer answers
            )
        else:
            self._speech_end = None
        kind: Kind = "conversation"
        if self._repair():
            kind = "recovery"
        elif token != self._speaker or (end is not None and end[1] != token):
            kind = "rollover"  # the first words of a rollover's next connection, or an end the old one heard
        self._speaker = token
        at = self._timeline.ms(now)
        self._out.notices.append(TurnTiming(item_id, token, kind, None if end is None else end[0], at))
