"""The retention actor: the scheduler's periodic pass (``mailroom.lifecycle.retention``)."""

from __future__ import annotations

import dramatiq

from actors.middleware.resources import current
from actors.middleware.retry_policy import RetryPolicy
from mailroom import queues as actor_names
from mailroom.lifecycle.retention import run_retention_pass


# One attempt: the next pass (scheduler.retention_interval_s) picks up where this one stopped.
@dramatiq.actor(**actor_names.APPLY_RETENTION.declared, retry_policy=RetryPolicy(max_attempts=1))
async def apply_retention() -> None:
    """Purge mails past their mailbox's retention_days; delete the objects queued for it."""
    resources = current()
    await run_retention_pass(
        await resources.sessions(), await resources.store(), resources.settings
    )
