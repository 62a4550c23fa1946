"""What needs an operator, and how long the oldest item has waited in each stage.

Shared by ``mailroom status`` and the Prometheus gauges (``mailroom.ops.gauges``):
both read the same SQL, so a dashboard and the command never disagree. Only current
state counts: a recognition attempt that a replay or review superseded is history,
not work for a person.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

#: Each item that waits for a person, in the order status shows them, and what fixes it.
NEEDS_OPERATOR = {
    "files_needs_check": "mailroom review list --status NEEDS_CHECK",
    "files_error": "mailroom review list --status ERROR",
    "jobs_dlq": "mailroom recognition status, then replay --job",
    "jobs_timeout": "mailroom recognition status, then replay --job",
    "jobs_error": "mailroom recognition status, then replay --job",
    "mails_failed": "mailroom intake status",
    "messages_failed": "mailroom delivery status, then replay --id",
    "messages_partial_failed": "mailroom delivery status, then replay --id",
    "messages_uncertain": "mailroom delivery status; ask the receiver, then "
    "resolve --id N --as delivered|failed, or replay --id",
    "cursors_blocked": "mailroom intake status, then unblock / reset --uid",
    "mailboxes_refused": "mailroom intake status (login, folder or certificate), "
    "fix it, then mailroom intake unblock NAME",
}

#: The stages an item moves through, in order, with what ``oldest`` measures in each.
STAGES = {
    "intake": "mail received, not stored yet",
    "recognition": "file's current job queued, published or processing",
    "notification": "mail final, its notifications not created yet",
    "delivery": "message pending or sending",
}

# Current jobs only: a file points at its current attempt.
NEEDS_OPERATOR_SQL = """
SELECT
  (SELECT count(*) FROM stored_file WHERE status = 'NEEDS_CHECK') AS files_needs_check,
  (SELECT count(*) FROM stored_file WHERE status = 'ERROR') AS files_error,
  count(*) FILTER (WHERE j.status = 'dlq') AS jobs_dlq,
  count(*) FILTER (WHERE j.status = 'timeout') AS jobs_timeout,
  count(*) FILTER (WHERE j.status = 'error') AS jobs_error,
  (SELECT count(*) FROM inbound_mail WHERE status = 'failed') AS mails_failed,
  (SELECT count(*) FROM channel_message WHERE status = 'failed') AS messages_failed,
  (SELECT count(*) FROM channel_message WHERE status = 'partial_failed')
    AS messages_partial_failed,
  (SELECT count(*) FROM channel_message WHERE status = 'uncertain') AS messages_uncertain,
  (SELECT count(*) FROM mailbox_cursor WHERE status = 'blocked' AND blocked_reason IS NULL)
    AS cursors_blocked,
  (SELECT count(*) FROM mailbox_cursor WHERE status = 'blocked' AND blocked_reason IS NOT NULL)
    AS mailboxes_refused
FROM stored_file f
JOIN recognition_job j ON j.id = f.current_recognition_job_id
WHERE j.status IN ('dlq', 'timeout', 'error')
"""

# Ages in seconds by the database's clock; NULL when the stage is empty.
OLDEST_SQL = """
SELECT
  (SELECT EXTRACT(EPOCH FROM now() - min(created_at)) FROM inbound_mail
    WHERE status = 'received') AS intake,
  (SELECT EXTRACT(EPOCH FROM now() - min(j.requested_at)) FROM stored_file f
    JOIN recognition_job j ON j.id = f.current_recognition_job_id
    WHERE j.status IN ('queued', 'published', 'processing')) AS recognition,
  (SELECT EXTRACT(EPOCH FROM now() - min(finalized_at)) FROM inbound_mail
    WHERE status = 'final' AND notified_at IS NULL) AS notification,
  (SELECT EXTRACT(EPOCH FROM now() - min(created_at)) FROM channel_message
    WHERE status IN ('pending', 'sending')) AS delivery
"""


def needs_operator_row(row: dict[str, object]) -> dict[str, int]:
    return {name: int(row[name] or 0) for name in NEEDS_OPERATOR}  # type: ignore[call-overload]


def oldest_row(row: dict[str, object]) -> dict[str, float | None]:
    return {
        stage: None if row[stage] is None else max(0.0, float(row[stage]))  # type: ignore[arg-type]
        for stage in STAGES
    }


async def needs_operator(session: AsyncSession) -> dict[str, int]:
    """Counts of final items that wait for a person, current attempts only."""
    row = (await session.execute(text(NEEDS_OPERATOR_SQL))).mappings().one()
    return needs_operator_row(dict(row))


async def oldest_per_stage(session: AsyncSession) -> dict[str, float | None]:
    """Seconds the oldest item of each stage has waited; None for an empty stage."""
    row = (await session.execute(text(OLDEST_SQL))).mappings().one()
    return oldest_row(dict(row))


def format_age(seconds: float | None) -> str:
    """``-`` for none, else ``42s``, ``5m 03s``, ``2h 07m``, ``3d 04h``."""
    if seconds is None:
        return "-"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"
