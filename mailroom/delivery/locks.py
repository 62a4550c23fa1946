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
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from mailroom.errors import LeaseLost
from mailroom.process.identity import host_pid

logger = logging.getLogger(__name__)

T = TypeVar("T")


class LockOwner:
    """This process as a lock owner, plus the messages it is delivering right now."""

    def __init__(self, name: str | None = None, *, started_at: float | None = None) -> None:
        self.name = name or host_pid()
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


class BatchLease:
    """Keeps the processing locks of a batch alive; a message whose lock is lost stops sending.

    ``renew(ids)`` extends the locks of ``ids`` in one round trip and returns the
    ids it extended; it runs every ``interval_s`` for every lock still held. A
    lock that was not extended (taken over or expired) is lost: the message's
    send running under ``guard`` is cancelled and raises ``LeaseLost``.

    A renewal that fails (Redis unreachable) says nothing about the locks: until
    ``ttl_s`` has passed since a lock was last taken or extended, nobody else can
    hold it, so its send goes on and the next renewal tries again; after that
    the lock counts as lost. Cancelling earlier would only cut off sends that
    may have reached the provider already, leaving their outcome unknown: a
    re-send or ``uncertain`` for a message that was sent. Use as ``async with``:
    the renewer stops on exit.
    """

    def __init__(
        self,
        renew: Callable[[list[int]], Awaitable[set[int]]],
        *,
        interval_s: float,
        ttl_s: float | None = None,
    ) -> None:
        self._renew = renew
        self.interval_s = interval_s
        #: How long a lock lives after it was taken or extended (the renewer runs at TTL/3).
        self.ttl_s = ttl_s if ttl_s is not None else 3 * interval_s
        #: Locks renewed until ``release``.
        self.held: set[int] = set()
        #: When each held lock was last taken or extended, by ``time.monotonic()``: the start
        #: of that call, so its expiry is no earlier than this plus ``ttl_s``.
        self._extended_at: dict[int, float] = {}
        self._lost: dict[int, str] = {}
        self._sending: dict[int, _Sending] = {}
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BatchLease:
        self._renewer = asyncio.ensure_future(self._renew_forever())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer

    def hold(self, message_ids: Iterable[int], *, at: float | None = None) -> None:
        """Renew the locks of ``message_ids``, taken just now (or ``at``, by ``time.monotonic()``,
        before they were asked for), until ``release``."""
        taken_at = time.monotonic() if at is None else at
        for message_id in message_ids:
            self.held.add(message_id)
            self._extended_at[message_id] = taken_at

    def release(self, message_id: int) -> None:
        """Stop renewing (call before the lock is deleted, so a renewal racing it is no loss)."""
        self.held.discard(message_id)
        self._extended_at.pop(message_id, None)

    def lost(self, message_id: int) -> str | None:
        """Why the lock of ``message_id`` was lost, or None while it is held."""
        return self._lost.get(message_id)

    async def guard(self, message_id: int, work: Awaitable[T]) -> T:
        """Await ``work``; raise ``LeaseLost`` if the message's lock is lost meanwhile.

        ``work`` runs in the calling task (a task of its own per send cost more CPU than
        the rest of the guard): a lost lock cancels that task, and the cancellation is
        taken back here. A cancellation from outside (worker shutdown) always propagates
        as such.
        """
        if message_id in self._lost:
            if asyncio.iscoroutine(work):
                work.close()
            raise LeaseLost(self._lost[message_id])
        task = asyncio.current_task()
        assert task is not None, "guard runs in a task"
        cancelling = task.cancelling()
        self._sending[message_id] = _Sending(task)
        try:
            return await work
        except asyncio.CancelledError:
            sending = self._sending.get(message_id)
            if sending is not None and sending.cancelled:
                sending.cancelled = False  # our request taken back, once
                if task.uncancel() <= cancelling:
                    # Nobody else's since: this task goes on, with LeaseLost.
                    raise LeaseLost(self._lost[message_id]) from None
            raise
        finally:
            sending = self._sending.pop(message_id, None)
            if sending is not None and sending.cancelled:
                # The work ended without our cancellation (it swallowed it, or turned it into
                # another error): the request must not cancel this task's next await.
                task.uncancel()

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            ids = sorted(self.held)
            if not ids:
                continue
            started = time.monotonic()
            try:
                kept = await self._renew(ids)
            except Exception as exc:
                # Unknown, not lost: only a lock that may have expired by now is given up.
                now = time.monotonic()
                expired = [mid for mid in ids if now - self._extended_at.get(mid, 0) >= self.ttl_s]
                self._lose(expired, f"renewal failed: {type(exc).__name__}: {exc}")
                if len(expired) < len(ids):
                    logger.warning(
                        "Renewing %d lock(s) failed (%s); their sends go on while the locks may "
                        "still be theirs",
                        len(ids) - len(expired),
                        type(exc).__name__,
                    )
                continue
            for message_id in kept:
                if message_id in self.held:
                    self._extended_at[message_id] = started
            self._lose([mid for mid in ids if mid not in kept], "lock taken over or expired")

    def _lose(self, message_ids: Iterable[int], reason: str) -> None:
        for message_id in message_ids:
            # Released meanwhile (settled): the lock is gone on purpose.
            if message_id not in self.held:
                continue
            self.held.discard(message_id)
            self._extended_at.pop(message_id, None)
            self._lost[message_id] = reason
            sending = self._sending.get(message_id)
            if sending is not None and not sending.cancelled:
                sending.cancelled = True
                sending.task.cancel()


@dataclass(eq=False)
class _Sending:
    """A send under ``BatchLease.guard``: its task, and whether the lease cancelled it."""

    task: asyncio.Task[Any]
    cancelled: bool = False


async def run_under_lease(
    work: Awaitable[T], *, renew: Callable[[], Awaitable[bool]], interval_s: float
) -> T:
    """Await ``work`` while ``renew`` extends one lease every ``interval_s``.

    When a renewal returns False or fails, ``work`` is cancelled and ``LeaseLost``
    raised: someone else may own the message now. A cancellation from outside
    (worker shutdown) always propagates as such.
    """

    async def renew_one(ids: list[int]) -> set[int]:
        return set(ids) if await renew() else set()

    async with BatchLease(renew_one, interval_s=interval_s) as lease:
        lease.hold([0])
        return await lease.guard(0, work)
