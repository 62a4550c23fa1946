"""Run work under a lease: a heartbeat renews it, and cancels the work once it is lost.

The work runs as its own task beside the heartbeat. When a renewal hits no row
(someone else holds the lease now) or fails (database down: we can no longer
prove the lease), the heartbeat cancels the work task only, and the caller gets
``LeaseLost``. A cancellation of the caller itself (worker shutdown) is never
turned into ``LeaseLost``: it propagates after the work task has finished its
cleanup. ``lease_write`` runs one statement of the lease's bookkeeping in one round trip.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import psycopg
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.db import psycopg_autocommit
from mailroom.errors import LeaseLost

logger = logging.getLogger(__name__)

T = TypeVar("T")

Renew = Callable[[], Awaitable[bool]]


async def run_under_lease(
    work: Coroutine[Any, Any, T], *, renew: Renew, interval_s: float, name: str = "lease"
) -> T:
    """Await ``work`` while ``renew`` runs every ``interval_s``; ``LeaseLost`` if renewal fails."""
    task = asyncio.create_task(work, name=f"{name}-work")
    lost: list[str] = []

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                # A renewal slower than the interval may already be too late: treat as lost.
                async with asyncio.timeout(interval_s):
                    renewed = await renew()
                reason = "" if renewed else "the lease is held by someone else"
            except Exception as exc:  # any failure means the lease can no longer be proven
                reason = f"renewal failed: {type(exc).__name__}: {str(exc)[:200]!r}"
            if reason:
                lost.append(reason)
                logger.warning("%s: %s; cancelling the work", name, reason)
                task.cancel()
                return

    beat = asyncio.create_task(heartbeat(), name=f"{name}-heartbeat")
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if lost and (current is None or current.cancelling() == 0):
            raise LeaseLost(f"{name}: {lost[0]}") from None
        raise
    finally:
        beat.cancel()
        # asyncio.wait never raises the heartbeat's own CancelledError into us.
        await asyncio.wait([beat])


async def lease_write(
    sessions: async_sessionmaker[AsyncSession], sql: str, params: dict[str, Any]
) -> tuple[Any, ...] | None:
    """One statement of the lease's bookkeeping as its own transaction, in one round trip.

    What ``lease_transaction`` does in four (``BEGIN``, ``SET LOCAL``, the statement,
    ``COMMIT``, each waited for through the ORM session) goes to Postgres in one
    pipeline on the psycopg connection, the statement prepared once per connection: the
    count and the finish of every poll cost the intake worker more CPU that way than
    parsing the poll's mails did. The first row the statement returns, if any.
    """
    async with psycopg_autocommit(sessions, clean=(psycopg.Error,)) as pg:
        try:
            async with pg.pipeline():
                await pg.execute("BEGIN")
                await pg.execute("SET LOCAL synchronous_commit = off")
                written = await pg.cursor().execute(sql, params, prepare=True)
                await pg.execute("COMMIT")
            row: tuple[Any, ...] | None = await written.fetchone()
        except psycopg.Error:
            if not pg.closed:
                await pg.rollback()  # the failed transaction block, if it is still open
            raise
    return row
