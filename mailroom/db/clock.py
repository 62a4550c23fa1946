"""The one clock: times that other processes compare come from the database.

Leases, deadlines, retry times and "stuck since" marks are written by one process
and compared by another (a second worker, the scheduler's sweeps, an operator's
command). Each process's own wall clock can be off by minutes; the database's
``now()`` is one clock for all of them. So every such time is read inside the
transaction that writes or compares it (``db_now``) or computed by the statement
itself (``db_after``). ``wall_now`` is only for what this process alone reads:
log lines, metrics, local timers.

``DbClock`` is the type use cases take, so tests can move time forward without
touching any process's clock (``tests/fixtures/imap.py``'s ``MutableClock``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

#: Reads the current time inside a session's transaction.
DbClock = Callable[[AsyncSession], Awaitable[datetime]]


def wall_now() -> datetime:
    """This process's clock, in UTC: only for what no other process compares."""
    return datetime.now(UTC)


async def db_now(session: AsyncSession) -> datetime:
    """The database's ``now()``: the start of the session's current transaction."""
    now: datetime | None = await session.scalar(select(func.now()))
    if now is None:  # pragma: no cover - now() is never NULL
        raise RuntimeError("the database returned no time")
    return now


def db_after(seconds: float) -> ColumnElement[datetime]:
    """``now() + seconds`` as the statement's own expression (negative: before now)."""
    return func.now() + _interval(seconds)


def _interval(seconds: float) -> ColumnElement[timedelta]:
    # make_interval takes fractional seconds; a bound timedelta would work too, but an
    # explicit function keeps the statement readable in logs.
    return func.make_interval(0, 0, 0, 0, 0, 0, float(seconds))
