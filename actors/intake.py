"""Intake actors: read a mailbox under its lease."""

from __future__ import annotations

import dramatiq

from actors import queues
from actors.retry_policy import RetryPolicy


@dramatiq.actor(queue_name=queues.INTAKE, retry_policy=RetryPolicy(max_attempts=3))
async def poll_mailbox(mailbox: str) -> None:
    """Read new mail of one configured mailbox (DESIGN.md §4)."""
    raise NotImplementedError("owned by the intake engineer")
