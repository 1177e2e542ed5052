"""The connection registry: every provider connection of one call, by transport token and connection id.

DESIGN principle 3: every piece of provider output carries its transport token, and output from a token that
is not current is inert. Tokens are allocated here and nowhere else, monotonically over the whole call
(recovery replacements and rollovers alike). The connection id that `connection_hooks.authorize` is keyed by
(RO7) is derived from the token, `conn-<token>`, so the two names of a connection can never disagree.

Roles: the *floor* is the one connection whose audio plays (RO8); *listeners* are rollover connections that
hear the caller but never speak or act; anything else is *stale* (quarantined or unknown: HR2, HR5) and is
counted, never acted on. The audio targets are the connections that receive the caller's audio.

The registry also keeps the latest resumable session handle the floor connection announced (Gemini
`sessionResumption`): a replacement or a rollover continues the conversation with it where the provider
supports resumption.

Sans-I/O and clock-free: plain bookkeeping the coordinator and the rollover controller share.
"""

from __future__ import annotations

import enum

PREFIX = "conn-"


def connection_id(token: int) -> str:
    """The connection id of a transport token (RO7)."""
    return f"{PREFIX}{token}"


def token_of(cid: str) -> int:
    """The transport token a connection id names; -1 for an id this registry did not make."""
    digits = cid[len(PREFIX) :] if cid.startswith(PREFIX) else ""
    return int(digits) if digits.isdigit() else -1


class Role(enum.Enum):
    FLOOR = "floor"
    LISTENER = "listener"
    STALE = "stale"


class Connections:
    """Tokens, ids, the floor, listeners, audio targets and the resumption handle of one call."""

    def __init__(self, first_token: int = 1) -> None:
        self.floor = first_token
        self.listeners: set[int] = set()
        self._highest = first_token
        self._receiving: set[int] = {first_token}
        self.audio_targets: tuple[int, ...] = (first_token,)
        self.handing_over = False
        self.stale_events = 0  # events from a quarantined or unknown transport, ignored
        self.resume_handle: str | None = None

    def allocate(self) -> int:
        """A new transport token: the only place tokens are made."""
        self._highest += 1
        return self._highest

    def allocate_id(self) -> str:
        """A new connection, named by its id (the rollover controller's allocator)."""
        return connection_id(self.allocate())

    def add_listener(self, token: int) -> None:
        """A rollover connection is being opened: it may listen, never speak (RO8)."""
        if token != self.floor:
            self.listeners.add(token)
            self._refresh()

    def classify(self, token: int) -> Role:
        if token == self.floor:
            return Role.FLOOR
        if token in self.listeners:
            return Role.LISTENER
        self.stale_events += 1
        return Role.STALE

    def known(self, token: int) -> bool:
        return token == self.floor or token in self.listeners

    # --- caller audio ---

    def start_input(self, token: int) -> None:
        self._receiving.add(token)
        self._refresh()

    def stop_input(self, token: int) -> None:
        self._receiving.discard(token)
        self._refresh()

    def _refresh(self) -> None:
        """Worked out when the targets change, not on every caller frame. `handing_over`: a rollover's switch
        is under way, the floor stopped hearing the caller and a listener hears them (RO8)."""
        self.audio_targets = tuple(sorted(t for t in self._receiving if self.known(t)))
        self.handing_over = bool(self.audio_targets) and self.floor not in self.audio_targets

    # --- changes of role ---

    def take_floor(self, token: int) -> bool:
        """A listener takes the floor; the old floor connection listens on (it may finish a transcript, RO3)."""
        if token == self.floor or token not in self.listeners:
            return False
        self.listeners.discard(token)
        self.listeners.add(self.floor)
        self.floor = token
        self._refresh()
        return True

    def drop(self, token: int) -> None:
        """A listener is closed or failed: it is stale from now on."""
        if token != self.floor:
            self.listeners.discard(token)
            self._receiving.discard(token)
            self._refresh()

    def replace_floor(self) -> tuple[int, list[int]]:
        """Recovery: a new token for the floor; the old floor and every listener are quarantined. Returns the
        new token and the tokens to close (old floor first)."""
        quarantined = [self.floor, *sorted(self.listeners)]
        self.floor = self.allocate()
        self.listeners.clear()
        self._receiving = {self.floor}
        self._refresh()
        return self.floor, quarantined

    def reset_inputs(self) -> None:
        """Only the floor hears the caller (a rollover was abandoned or restarted)."""
        self._receiving = {self.floor}
        self._refresh()

    # --- resumption ---

    def resumption_updated(self, token: int, handle: str, resumable: bool) -> None:
        """Keep the floor connection's latest resumable handle (a non-resumable update keeps the last good one)."""
        if token == self.floor and resumable and handle:
            self.resume_handle = handle

    def status(self) -> dict[str, object]:
        return {
            "floor": self.floor,
            "listeners": sorted(self.listeners),
            "receiving": list(self.audio_targets),
            "resumable": self.resume_handle is not None,
        }
