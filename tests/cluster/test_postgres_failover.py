"""Mailroom on a Postgres primary and its standby: the primary SIGKILLed, the standby promoted.

Every connection site is given the two hosts (``database.hosts``) and connects to the one
that takes writes: the engines, alembic, and the psycopg connections of the leader election
and of ``mailroom status``.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from mailroom.db.dsn import psycopg_dsn
from mailroom.db.engine import create_engine, database_url
from mailroom.db.migrate import upgrade
from mailroom.settings import DatabaseSettings
from scheduling.leader import LeaderElection, current_leader

pytestmark = pytest.mark.cluster

#: Longest the writes and the leadership may take to come back after the kill, in seconds.
RECOVERY_BOUND_S = 30.0
#: Rows the flow writes, and the row after which the primary is killed.
ROWS, KILL_AT = 120, 40


async def test_writes_and_the_scheduler_leadership_move_to_the_promoted_standby(postgres_pair):
    settings = DatabaseSettings(
        url="postgresql+psycopg://postgres@unused:1/mailroom",
        hosts=postgres_pair.hosts,
        connect_timeout_s=2,
    )
    # Alembic migrates through the host list (the schema streams to the standby)
    upgrade(database_url(settings))
    election = LeaderElection(psycopg_dsn(settings), 4242, name="scheduler-a", database=settings)
    assert election.try_acquire()
    engine = create_engine(settings)
    acked: list[int] = []
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE flow (n int PRIMARY KEY)"))
        killed_at = 0.0
        for n in range(ROWS):
            if n == KILL_AT:
                postgres_pair.primary.kill()
                killed_at = time.monotonic()
                postgres_pair.standby.promote()
            await _write(engine, n, deadline=time.monotonic() + RECOVERY_BOUND_S)
            acked.append(n)
        resumed_s = time.monotonic() - killed_at

        # The old leader's session died with the primary; a new one leads on the standby
        assert not election.still_leader()
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while not election.try_acquire():
            assert time.monotonic() < deadline, "no leader on the promoted standby"
            await asyncio.sleep(0.2)
        assert current_leader(psycopg_dsn(settings), 4242) == "scheduler-a"

        async with engine.connect() as conn:
            rows = [row[0] for row in await conn.execute(text("SELECT n FROM flow ORDER BY n"))]
            recovery = (await conn.execute(text("SELECT pg_is_in_recovery()"))).scalar()
        assert rows == acked, f"lost {sorted(set(acked) - set(rows))}"
        assert recovery is False
        print(f"writes resumed {resumed_s:.2f} s after the kill")
    finally:
        election.release()
        await engine.dispose()


async def _write(engine, n: int, *, deadline: float) -> None:
    """Insert ``n`` (idempotent), retried until the deadline while no server takes writes."""
    while True:
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    text("INSERT INTO flow VALUES (:n) ON CONFLICT DO NOTHING"), {"n": n}
                )
            return
        except DBAPIError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
