"""What the "needs a person" page reads: the counts ``mailroom status`` shows (one set of
queries, ``mailroom/ops/attention.py``) and the items behind each, each with its action."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.concurrency import run_in_threadpool

from mailroom.delivery.status import StuckMessage, stuck_messages
from mailroom.ops.attention import needs_operator, oldest_per_stage
from mailroom.ops.dead_letters import DeadLetter, list_dead_letters
from mailroom.recognition.gate import closed_gates, gate_lines
from mailroom.settings import Settings

#: Most items listed per cause.
LIST_LIMIT = 50
#: The stores whose rows are counted per status, and their status column's table.
STORES = {
    "mails": "inbound_mail",
    "files": "stored_file",
    "jobs": "recognition_job",
    "messages": "channel_message",
    "cursors": "mailbox_cursor",
}


@dataclass
class Attention:
    counts: dict[str, int]
    oldest_s: dict[str, float | None]
    per_status: dict[str, dict[str, int]]
    gates: list[str]
    cursors: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    mails: list[dict[str, Any]] = field(default_factory=list)
    messages: list[StuckMessage] = field(default_factory=list)
    messages_total: int = 0
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: Why the dead letters could not be read (the broker's Redis is down), if so.
    dead_letters_problem: str | None = None


async def read_attention(session: AsyncSession, settings: Settings) -> Attention:
    """Everything the page shows, read in one session (dead letters from the broker's Redis)."""
    per_status = {}
    for store, table in STORES.items():
        rows = await session.execute(text(f"SELECT status, count(*) FROM {table} GROUP BY status"))
        per_status[store] = {status: int(count) for status, count in rows.all()}
    found = Attention(
        counts=await needs_operator(session),
        oldest_s=await oldest_per_stage(session),
        per_status=per_status,
        gates=gate_lines(await closed_gates(session)),
    )
    found.cursors = await _rows(
        session,
        """SELECT mailbox, folder, status, blocked_reason, blocked_uid, retry_count,
                  next_retry_at, left(last_error, 300) AS last_error
             FROM mailbox_cursor WHERE status IN ('blocked', 'failed')
            ORDER BY status, mailbox, folder LIMIT :limit""",
    )
    found.jobs = await _rows(
        session,
        """SELECT f.id AS file_id, f.original_name, f.mail_id, j.id AS job_id, j.status,
                  j.attempt, j.error_code, left(j.error_message, 300) AS error_message,
                  COALESCE(j.finished_at, j.requested_at) AS since
             FROM stored_file AS f JOIN recognition_job AS j ON j.id = f.current_recognition_job_id
            WHERE j.status IN ('dlq', 'timeout', 'error')
            ORDER BY since, f.id LIMIT :limit""",
    )
    found.mails = await _rows(
        session,
        """SELECT m.id, c.mailbox, m.uid, m.sender, m.subject, m.retry_count,
                  left(m.last_error, 300) AS last_error, m.last_attempt_at
             FROM inbound_mail AS m LEFT JOIN mailbox_cursor AS c ON c.id = m.cursor_id
            WHERE m.status = 'failed' ORDER BY m.id LIMIT :limit""",
    )
    found.messages, found.messages_total = await stuck_messages(
        session, settings.delivery, limit=LIST_LIMIT
    )
    try:
        found.dead_letters = await run_in_threadpool(list_dead_letters, settings, limit=LIST_LIMIT)
    except redis.RedisError as exc:
        found.dead_letters_problem = f"the broker's Redis cannot be read: {type(exc).__name__}"
    return found


async def _rows(session: AsyncSession, sql: str) -> list[dict[str, Any]]:
    return [dict(row._mapping) for row in await session.execute(text(sql), {"limit": LIST_LIMIT})]
