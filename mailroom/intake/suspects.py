"""A mail under suspicion is read alone in its process, so a death is charged to the right mail.

After a worker died, each mailbox that had a poll in flight is read mail by mail, every
mail's attempt counted before it is read (``batch._ingest_one_by_one``). Polls of other
mailboxes run in the same process, though: had one of them killed it while a suspect
mail's attempt was open, that innocent mail would be charged with the death, and after
``intake.max_retries`` such coincidences its mailbox would block on it (the polls of two
mailboxes restarted together tend to meet again). So within one process (one event loop)
a suspect mail is read, from its count to its commit, while no other poll parses: polls in
order share the gate, a suspect mail takes it alone and goes first.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class ParseGate:
    """Many batches at once, or one suspect mail alone; a waiting suspect goes first."""

    def __init__(self) -> None:
        self.sharing = 0
        self.alone_now = False
        self.waiting_alone = 0
        self._changed = asyncio.Event()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            self._changed.clear()
            await self._changed.wait()

    def _release(self) -> None:
        # No await: a cancelled holder still lets the others in.
        self._changed.set()

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        await self._until(lambda: not self.alone_now and not self.waiting_alone)
        self.sharing += 1
        try:
            yield
        finally:
            self.sharing -= 1
            self._release()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        self.waiting_alone += 1
        try:
            await self._until(lambda: not self.alone_now and not self.sharing)
        finally:
            self.waiting_alone -= 1
            self._release()
        self.alone_now = True
        try:
            yield
        finally:
            self.alone_now = False
            self._release()


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ParseGate] = (
    weakref.WeakKeyDictionary()
)


def parse_gate() -> ParseGate:
    """The gate of the running loop: a worker process runs its polls on one loop."""
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = ParseGate()
    return gate
