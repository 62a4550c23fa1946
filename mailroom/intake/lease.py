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

from mailroom.db.engine import psycopg_autocommit
from mailroom.errors import LeaseLost
from mailroom.intake.cursor_sql import ASYNC_COMMIT

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

    The statement runs alone on the psycopg connection in autocommit, prepared once per
    connection, and commits asynchronously by itself (``cursor_sql.ASYNC_COMMIT``): through
    an ORM session it took four round trips, then a pipeline of four statements, and the
    count and the finish of every poll cost the intake worker more CPU than parsing the
    poll's mails did. The first row the statement returns, if any.
    """
    if ASYNC_COMMIT not in sql:
        raise ValueError("a lease write commits asynchronously: its statement sets ASYNC_COMMIT")
    async with psycopg_autocommit(sessions, clean=(psycopg.Error,)) as pg:
        written = await pg.execute(sql, params, prepare=True)
        row: tuple[Any, ...] | None = await written.fetchone()
    return row
