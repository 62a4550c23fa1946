"""Audit events of the intake pipeline (``audit_event`` rows, one per operator-visible change)."""

from __future__ import annotations

import getpass
import os
import socket
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.models import AuditEvent

CURSOR_BLOCKED = "intake.cursor_blocked"
UIDVALIDITY_CHANGED = "intake.uidvalidity_changed"
UNBLOCKED = "intake.unblocked"
RESET = "intake.reset"


def cursor_target(mailbox: str, folder: str) -> str:
    return f"mailbox:{mailbox}/{folder}"


def worker_id() -> str:
    """``host-pid`` of this process, the actor of system events."""
    return f"{socket.gethostname()}-{os.getpid()}"


def operator_id() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return f"uid-{os.getuid()}"


async def record_audit(
    session: AsyncSession,
    action: str,
    *,
    target: str,
    detail: dict[str, Any],
    actor_type: str = "system",
    actor_id: str | None = None,
) -> None:
    """Add one audit event to the caller's transaction."""
    await session.execute(
        insert(AuditEvent).values(
            actor_type=actor_type,
            actor_id=actor_id or worker_id(),
            action=action,
            target=target,
            detail=detail,
        )
    )
