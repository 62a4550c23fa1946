"""Reading and writing ``runtime_config`` rows; every write draws a new version.

A row's ``config`` is validated by the same pydantic model as its environment
setting before it is written (``kinds.validate``), so the table never holds
what the settings would refuse.
"""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from mailroom.db.engine import psycopg_autocommit
from mailroom.db.models import RuntimeConfig

_NEXT_VERSION = text("nextval('runtime_config_version_seq')")


_VERSION_OF = "SELECT coalesce(max(version), 0), count(*) FROM runtime_config WHERE kind = %s"


async def version_of(sessions: async_sessionmaker[AsyncSession], kind: str) -> tuple[int, int]:
    """``(highest version, row count)`` of ``kind``: changes on any write, one cheap query.

    One prepared statement in autocommit on a pooled connection's psycopg connection:
    every poll and notification pass asks, and through SQLAlchemy's execute the check
    cost the caller about 0.7 ms of CPU against 0.3 ms here.
    """
    async with psycopg_autocommit(sessions, clean=(psycopg.Error,)) as pg:
        row = await (await pg.execute(_VERSION_OF, (kind,), prepare=True)).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns one row
    return int(row[0]), int(row[1])


async def rows_of(db: AsyncSession | AsyncConnection, kind: str) -> list[RuntimeConfig]:
    result = await db.execute(
        select(RuntimeConfig).where(RuntimeConfig.kind == kind).order_by(RuntimeConfig.name)
    )
    return list(result.scalars()) if isinstance(db, AsyncSession) else _rows(result)


def _rows(result: Any) -> list[RuntimeConfig]:
    """Core rows (a connection's result) as detached model objects."""
    return [RuntimeConfig(**dict(row._mapping)) for row in result]


async def get_row(session: AsyncSession, kind: str, name: str) -> RuntimeConfig | None:
    return await session.get(RuntimeConfig, (kind, name))


async def put_row(
    session: AsyncSession,
    *,
    kind: str,
    name: str,
    config: dict[str, Any],
    source: str,
    actor: str,
    enabled: bool = True,
) -> None:
    """Insert or replace the row (operator writes; a seed goes through ``seed_row``)."""
    values = {
        "kind": kind,
        "name": name,
        "config": config,
        "source": source,
        "enabled": enabled,
        "updated_by": actor,
        "version": _NEXT_VERSION,
    }
    statement = insert(RuntimeConfig).values(values)
    statement = statement.on_conflict_do_update(
        index_elements=["kind", "name"],
        set_={
            "config": statement.excluded.config,
            "source": statement.excluded.source,
            "enabled": statement.excluded.enabled,
            "updated_by": statement.excluded.updated_by,
            "version": _NEXT_VERSION,
            "updated_at": func.now(),
        },
    )
    await session.execute(statement)


async def seed_row(
    session: AsyncSession, *, kind: str, name: str, config: dict[str, Any], actor: str
) -> bool:
    """Insert, or update a row still owned by the settings when its config differs.

    Returns whether the row was written. Rows an operator changed are never touched.
    """
    statement = insert(RuntimeConfig).values(
        kind=kind,
        name=name,
        config=config,
        source="settings",
        updated_by=actor,
        version=_NEXT_VERSION,
    )
    statement = statement.on_conflict_do_update(
        index_elements=["kind", "name"],
        set_={
            "config": statement.excluded.config,
            "updated_by": statement.excluded.updated_by,
            "version": _NEXT_VERSION,
            "updated_at": func.now(),
        },
        where=(RuntimeConfig.source == "settings")
        & (RuntimeConfig.config != statement.excluded.config),
    )
    result = await session.execute(statement.returning(RuntimeConfig.version))
    return result.first() is not None


async def set_enabled(
    session: AsyncSession, *, kind: str, name: str, enabled: bool, actor: str
) -> bool:
    """Enable or disable a row (it becomes the operator's); False when there is no such row."""
    row = await session.get(RuntimeConfig, (kind, name), with_for_update=True)
    if row is None:
        return False
    row.enabled = enabled
    row.source = "operator"
    row.updated_by = actor
    row.version = (await session.execute(select(_NEXT_VERSION))).scalar_one()
    row.updated_at = func.now()
    return True
