"""The pool's reset on return (``mailroom.db.engine._rollback_unless_idle``) on a real Postgres.

SQLAlchemy's own reset rolls back every returned connection; the engine rolls
back only one that comes back inside a transaction, which must still happen:
a leaked transaction would hold its locks and show its state to the next user.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from mailroom.db.engine import create_engine, create_sessionmaker
from mailroom.settings import DatabaseSettings

pytestmark = pytest.mark.integration

#: Advisory lock key the leaked transaction holds.
LOCK_KEY = 7_140_001


@pytest.fixture
async def engine(postgres_server) -> AsyncIterator[AsyncEngine]:
    # One pooled connection, so each checkout gets the one returned before.
    made = create_engine(DatabaseSettings(url=postgres_server.url("postgres"), pool_size=1))
    async with made.connect():
        pass  # the first connect's own rollback (dialect set-up) happens here
    yield made
    await made.dispose()


def _count_rollbacks(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the rollbacks the engine's connections receive from now on."""
    calls = [0]
    dialect = engine.sync_engine.dialect
    assert engine.sync_engine.pool._dialect is dialect  # the pool's reset goes through it too
    rollback = dialect.do_rollback

    def counted(dbapi_connection: Any) -> None:
        calls[0] += 1
        rollback(dbapi_connection)

    monkeypatch.setattr(dialect, "do_rollback", counted)
    return calls


async def test_a_connection_returned_inside_a_transaction_is_rolled_back(engine, postgres_server):
    async with engine.connect() as conn:
        adapted: Any = await conn.get_raw_connection()
        # A transaction SQLAlchemy does not know about: only the pool can end it.
        await adapted.driver_connection.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))

    with psycopg.connect(postgres_server.dsn("postgres"), autocommit=True) as other:
        row = other.execute("SELECT pg_try_advisory_xact_lock(%s)", (LOCK_KEY,)).fetchone()
    assert row == (True,), "the returned connection still holds its transaction's lock"
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT 1"))).scalar() == 1


async def test_a_connection_returned_idle_is_not_rolled_back_again(engine, monkeypatch):
    rollbacks = _count_rollbacks(engine, monkeypatch)
    sessions = create_sessionmaker(engine)

    async with sessions() as session, session.begin():
        await session.execute(text("SELECT 1"))
    committed = rollbacks[0]
    async with sessions() as session:
        await session.execute(text("SELECT 1"))  # ends with the session's own rollback
    read_only = rollbacks[0] - committed

    assert committed == 0
    assert read_only == 1
