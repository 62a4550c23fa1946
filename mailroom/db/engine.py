"""Database engine and sessions: SQLAlchemy 2 ``AsyncSession`` over psycopg 3."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import event
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import PoolResetState

from mailroom.db.dsn import (
    connection_params,
    host_pairs,
    keepalive_args,
    server_keepalive_options,
    tls_params,
)
from mailroom.settings import DatabaseSettings

#: Sent first in a transaction whose prepared statements find their rows by key alone: their
#: generic plans, for that transaction only. At the default (``auto``) Postgres keeps planning
#: such a statement anew whenever the custom plans look cheaper, which for a statement run per
#: mail or per batch costs more CPU than running it. Never on a connection as a whole: a query
#: that binds a status the partial indexes name (``status = 'queued'``) needs its custom plan.
GENERIC_PLANS = "SET LOCAL plan_cache_mode = force_generic_plan"


def create_engine(settings: DatabaseSettings) -> AsyncEngine:
    """An async engine whose connections carry the statement timeout and UTC."""
    engine = create_async_engine(
        database_url(settings),
        pool_size=settings.pool_size,
        max_overflow=settings.pool_size,
        # No pre-ping: it costs a round trip per checkout. A connection that died with
        # its server fails the statement, SQLAlchemy drops the pool, and the actor retries.
        pool_pre_ping=False,
        pool_recycle=1800,
        # Sessions end their transactions (commit, or rollback on close), so a connection
        # comes back idle and SQLAlchemy's ROLLBACK on return is a no-op that still costs a
        # trip through the async adapter on every checkin: _rollback_unless_idle does it
        # only for a connection that really comes back inside a transaction.
        pool_reset_on_return=None,
        # Statement parameters carry mail data and document fields: errors and logs
        # (and so Sentry) show the SQL only.
        hide_parameters=True,
        connect_args={
            "options": f"-c statement_timeout={settings.statement_timeout_ms} -c timezone=UTC "
            + server_keepalive_options(settings),
            # An unroutable host otherwise hangs for the OS's TCP timeout (minutes).
            "connect_timeout": settings.connect_timeout_s,
            **keepalive_args(settings),
        },
    )
    event.listen(engine.sync_engine.pool, "reset", _rollback_unless_idle)
    return engine


def _rollback_unless_idle(dbapi_connection: Any, record: Any, state: PoolResetState) -> None:
    """The pool's reset on return, skipped for a connection outside any transaction."""
    if not state.asyncio_safe or state.terminate_only:
        return  # SQLAlchemy terminates this connection instead of reusing it
    if dbapi_connection.driver_connection.pgconn.transaction_status != TransactionStatus.IDLE:
        # An error here makes the pool discard the connection, as its own reset would.
        dbapi_connection.rollback()


def database_url(settings: DatabaseSettings) -> str:
    """``settings.url`` with the password and the TLS settings (``sslmode``, certificates).

    In the URL rather than in connect arguments, so every connection takes them: the
    engines, alembic, and the direct psycopg connections of ``libpq_dsn``. The result
    carries the password: never log it (``mailroom.redaction.mask_urls`` masks it).
    """
    from sqlalchemy.engine import URL, make_url

    params = connection_params(settings)
    pairs = host_pairs(params)
    if len(pairs) > 1 or "target_session_attrs" in params:
        # SQLAlchemy's own spelling of several hosts; it hands libpq the comma lists.
        named = {"host", "port", "user", "password", "dbname"}
        query: dict[str, str | tuple[str, ...]] = {
            name: value for name, value in params.items() if name not in named
        }
        query["host"] = tuple(f"{host}:{port}" if port else host for host, port in pairs)
        return URL.create(
            settings.url.partition("://")[0],
            username=params.get("user"),
            password=params.get("password"),
            database=params.get("dbname"),
            query=query,
        ).render_as_string(hide_password=False)
    given = tls_params(settings)
    password = settings.password.get_secret_value()
    if not given and not password:
        return settings.url
    url = make_url(settings.url).update_query_dict(given)
    if password:
        url = url.set(password=password)
    return url.render_as_string(hide_password=False)


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def autocommit(
    sessions: async_sessionmaker[AsyncSession],
) -> AsyncIterator[AsyncConnection]:
    """A pooled connection in autocommit, for a lone read: one round trip per statement.

    A session would wrap the read in ``BEGIN`` and ``ROLLBACK`` (three round trips),
    which for a version check or a load before the real work cost more than the query.
    """
    engine = sessions.kw["bind"]
    assert isinstance(engine, AsyncEngine)
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        yield connection


async def driver_connection(connection: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under ``connection``, for statements sent past SQLAlchemy."""
    pg = (await connection.get_raw_connection()).driver_connection
    if not isinstance(pg, psycopg.AsyncConnection):
        raise TypeError("statements sent through psycopg need an engine on its async driver")
    return pg


@asynccontextmanager
async def psycopg_autocommit(
    sessions: async_sessionmaker[AsyncSession], *, clean: tuple[type[BaseException], ...] = ()
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The psycopg connection of ``autocommit``, for transactions spelled out in a pipeline.

    Ended by an exception other than the ``clean`` ones, it may be mid-pipeline with its
    protocol state unknown: it is closed rather than handed back to the pool.
    """
    async with autocommit(sessions) as connection:
        pg = await driver_connection(connection)
        try:
            yield pg
        except clean:
            raise
        except BaseException:
            await connection.invalidate()
            raise


@asynccontextmanager
async def transaction(
    sessions: async_sessionmaker[AsyncSession],
) -> AsyncIterator[AsyncSession]:
    """One short transaction: commit on success, roll back on any error."""
    async with sessions() as session, session.begin():
        yield session


def libpq_dsn(url: str) -> str:
    """The SQLAlchemy URL as a plain libpq DSN, for direct psycopg connections."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
