"""A route's greeting: the model is asked to speak as soon as the call's first connection is up.

On a call the bridge placed, that is while the callee's phone still rings: the session core holds the
greeting, as any speakable update, until the callee answers (S7, bridge/engine/coordinator.py `ring`), so it is spoken
to the callee and not into the ringing line, and nothing the model says meanwhile can overflow or go stale.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger("parlora")

GREETING_WAIT_S = 10.0  # how long a greeting waits for the call's first provider connection
GREETING_POLL_S = 0.02


class Updatable(Protocol):
    @property
    def call_id(self) -> str: ...

    def push_update(self, text: str, *, speak: bool = True) -> bool: ...


async def greet(call: Updatable, text: str, *, wait_s: float = GREETING_WAIT_S) -> bool:
    """Push `text` as a spoken update once the session takes one (it does only after its first connection is
    up, so this retries, bounded in time); False when the call ended or never came up within `wait_s`."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + wait_s
    while True:
        if call.push_update(text, speak=True):
            log.info("call %s: greeting asked of the model", call.call_id)
            return True
        if loop.time() >= give_up:
            log.warning(
                "call %s: greeting not delivered: the call did not come up within %g s", call.call_id, wait_s
            )
            return False
        await asyncio.sleep(GREETING_POLL_S)
