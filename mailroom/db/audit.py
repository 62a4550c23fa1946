"""Audit events: who did what to which record."""

from __future__ import annotations

import getpass
import os
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.db.engine import create_engine, create_sessionmaker, transaction
from mailroom.db.models import AuditEvent
from mailroom.settings import Settings

#: ``actor_type`` of what an operator did through the CLI; ``actor_id`` is ``operator_id()``.
OPERATOR = "operator"
#: ``actor_type`` of what the pipelines did on their own; ``actor_id`` is ``host_pid()``.
SYSTEM = "system"


def operator_id() -> str:
    """The OS user running the command, or ``uid-N`` where there is no passwd entry."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (containers)
        return f"uid-{os.getuid()}"


def add_audit_event(
    session: AsyncSession,
    *,
    actor_type: str,
    actor_id: str,
    action: str,
    target: str,
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    """Add an event to the caller's transaction."""
    event = AuditEvent(
        actor_type=actor_type, actor_id=actor_id, action=action, target=target, detail=detail or {}
    )
    session.add(event)
    return event


async def record_audit_event(settings: Settings, **event: Any) -> None:
    """Record one event in its own transaction (operator commands outside a pipeline)."""
    engine = create_engine(settings.database)
    try:
        async with transaction(create_sessionmaker(engine)) as session:
            add_audit_event(session, **event)
    finally:
        await engine.dispose()
