"""Audit events of the intake pipeline (``audit_event`` rows, one per operator-visible change)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.db.audit import SYSTEM, add_audit_event
from mailroom.process.identity import host_pid

CURSOR_BLOCKED = "intake.cursor_blocked"
UIDVALIDITY_CHANGED = "intake.uidvalidity_changed"
UNBLOCKED = "intake.unblocked"
RESET = "intake.reset"


def cursor_target(mailbox: str, folder: str) -> str:
    return f"mailbox:{mailbox}/{folder}"


async def record_audit(
    session: AsyncSession,
    action: str,
    *,
    target: str,
    detail: dict[str, Any],
    actor_type: str = SYSTEM,
    actor_id: str | None = None,
) -> None:
    """Add one audit event to the caller's transaction (this worker's, unless told)."""
    add_audit_event(
        session,
        actor_type=actor_type,
        actor_id=actor_id or host_pid(),
        action=action,
        target=target,
        detail=detail,
    )
