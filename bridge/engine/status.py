"""What `status()` and `GET /calls/{id}` show of one session core (SE7, HR13, DESIGN §9).

The assembly of the view, apart from the rules: each part reports its own figures; this module only puts
them together, and adds the call leg's RTP figures when the leg runs the stream itself (it declares
`sip.leg.LegFeatures.qos`: the native engine).
"""

from __future__ import annotations

from typing import Any, Protocol

from bridge.engine.barrier import BargeIn, Channel
from bridge.engine.connections import Connections
from bridge.engine.delegations import Delegations
from bridge.engine.no_input import NoInputRoom
from bridge.engine.recovery import RecoveryController
from bridge.engine.reservoir import Line, OutputPath
from bridge.engine.rollover import RolloverLink
from bridge.engine.telephony import CallEnding
from bridge.engine.timeline import Timeline
from bridge.engine.usage import UsageMeter
from sip.leg import offers_qos


class SessionParts(Protocol):
    """What the view reads of a session core (bridge/engine/coordinator.py `SessionCoordinator`)."""

    state: str
    frames_in: int
    timeline: Timeline
    connections: Connections
    output: OutputPath
    barge: BargeIn
    recovery: RecoveryController
    rollover: RolloverLink
    delegations: Delegations
    ending: CallEnding
    usage: UsageMeter
    call_line: Line
    no_input: NoInputRoom

    @property
    def token(self) -> int: ...


def leg_qos(channel: Channel) -> dict[str, object]:
    """The leg's jitter, loss, RTT and packets in/out, when the leg provides them (else nothing)."""
    if not offers_qos(channel):
        return {}
    qos = channel.qos()
    return {"rtp": None if qos is None else qos.as_dict(), "media": channel.media_counters()}


def session_status(core: SessionParts, now: int) -> dict[str, Any]:
    """The session's state (`connecting`/`ready`/`closing`/`closed`/`failed`) and every part's figures."""
    return {
        "state": "closed" if core.ending.leg_ended else core.state,
        "session_ms": core.timeline.ms(now),
        "line": core.call_line.state,  # S7: "up", "held" or "ringing"
        "transport_token": core.token,
        "output_recovery": core.recovery.state.status(),
        "rollover": core.rollover.status(),
        **core.output.status(now),
        "playback": core.barge.status(),
        "qos": {
            "frames_in": core.frames_in,
            "underruns": core.output.underruns,
            "suppressed_bytes": core.barge.suppressed_bytes,
            "stale_events": core.connections.stale_events,
            "listener_audio_bytes": core.rollover.listener_audio_bytes,
            **leg_qos(core.output.channel),
        },
        "recoveries": core.recovery.status(),
        "delegations": core.delegations.status(),
        "usage": core.usage.status(),
        "no_input": core.no_input.status(),  # None: off
        "cost": core.usage.cost_status(),  # the usage split and its price (bridge/engine/usage.py)
    }
