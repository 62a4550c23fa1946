"""Database engine and sessions: SQLAlchemy 2 ``AsyncSession`` over psycopg 3."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from mailroom.settings import DatabaseSettings


def create_engine(settings: DatabaseSettings) -> AsyncEngine:
    """An async engine whose connections carry the statement timeout and UTC."""
    return create_async_engine(
        settings.url,
        pool_size=settings.pool_size,
        max_overflow=settings.pool_size,
        pool_pre_ping=True,
        connect_args={
            "options": f"-c statement_timeout={settings.statement_timeout_ms} -c timezone=UTC"
        },
    )


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def transaction(
    sessions: async_sessionmaker[AsyncSession],
) -> AsyncIterator[AsyncSession]:
    """One short transaction: commit on success, roll back on any error."""
    async with sessions() as session, session.begin():
        yield session


def sync_url(url: str) -> str:
    """The same database for synchronous tools (alembic, CLI tables)."""
    return url  # psycopg 3 serves both sync and async under one dialect name
