"""The per-message processing lock: who we are, and sending under a renewed lease.

The lock lives in Redis (``SET NX PX``) with the owner ``{host-pid, started_at}``
as its value. A lock we own is re-taken after a restart of the attempt (the
same process, the earlier attempt gone); a process delivering the same message
twice at once is prevented locally, because both attempts carry one owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from mailroom.errors import LeaseLost

logger = logging.getLogger(__name__)

T = TypeVar("T")


class LockOwner:
    """This process as a lock owner, plus the messages it is delivering right now."""

    def __init__(self, name: str | None = None, *, started_at: float | None = None) -> None:
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.started_at = started_at if started_at is not None else time.time()
        #: The lock value: identical for every attempt of this owner.
        self.token = json.dumps(
            {"owner": self.name, "started_at": round(self.started_at, 6)}, sort_keys=True
        )
        self._active: set[int] = set()
        self._guard = threading.Lock()

    def enter(self, message_id: int) -> bool:
        """Mark ``message_id`` as in progress here; False when it already is."""
        with self._guard:
            if message_id in self._active:
                return False
            self._active.add(message_id)
            return True

    def leave(self, message_id: int) -> None:
        with self._guard:
            self._active.discard(message_id)


_process_owner: LockOwner | None = None
_process_owner_pid = 0


def process_owner() -> LockOwner:
    """The lock owner of this process (a fresh one after a fork)."""
    global _process_owner, _process_owner_pid
    if _process_owner is None or _process_owner_pid != os.getpid():
        _process_owner, _process_owner_pid = LockOwner(), os.getpid()
    return _process_owner


async def run_under_lease(
    work: Awaitable[T], *, renew: Callable[[], Awaitable[bool]], interval_s: float
) -> T:
    """Await ``work`` while ``renew`` extends the lease every ``interval_s``.

    When a renewal returns False or fails, ``work`` is cancelled and ``LeaseLost``
    raised: someone else may own the message now. A cancellation from outside
    (worker shutdown) always propagates as such.
    """
    task = asyncio.ensure_future(work)
    lost: list[str] = []

    async def renewer() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                ok = await renew()
                reason = "lock taken over or expired"
            except Exception as exc:
                ok, reason = False, f"renewal failed: {type(exc).__name__}: {exc}"
            if not ok:
                lost.append(reason)
                task.cancel()
                return

    renewing = asyncio.ensure_future(renewer())
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if lost and not (current is not None and current.cancelling()):
            raise LeaseLost(lost[0]) from None
        raise
    finally:
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
