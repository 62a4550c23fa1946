"""Read-only views for operators: counts per status and channel, stuck messages, the stream."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import redis.asyncio as aioredis
import redis.exceptions
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.db.models import ChannelMessage
from mailroom.settings import DeliverySettings


@dataclass(frozen=True)
class StreamState:
    length: int
    #: Entries read by a bridge and not acknowledged yet.
    pending: int
    consumers: int
    #: Whether the consumer group exists yet (created by the first bridge).
    group_exists: bool


async def message_counts(session: AsyncSession) -> list[tuple[str, str, int]]:
    """(status, channel, count) for every combination present, sorted."""
    rows = await session.execute(
        select(ChannelMessage.status, ChannelMessage.channel, func.count())
        .group_by(ChannelMessage.status, ChannelMessage.channel)
        .order_by(ChannelMessage.status, ChannelMessage.channel)
    )
    return [(status, channel, int(count)) for status, channel, count in rows]


async def stream_state(client: aioredis.Redis, settings: DeliverySettings) -> StreamState:
    length = int(await client.xlen(settings.stream_key))
    try:
        groups = await client.xinfo_groups(settings.stream_key)
    except redis.exceptions.ResponseError:  # no such key yet
        groups = []
    for group in groups:
        name = group.get("name")
        if isinstance(name, bytes):
            name = name.decode()
        if name == settings.consumer_group:
            return StreamState(length, int(group["pending"]), int(group["consumers"]), True)
    return StreamState(length, 0, 0, False)


@dataclass(frozen=True)
class StuckMessage:
    id: int
    channel: str
    account: str
    status: str
    attempts: int
    reason: str
    since: datetime


#: Longest reason kept for a stuck message, in characters.
REASON_CHARS = 160

# Final failures wait for an operator; a send older than stale_after_s is stuck until
# the stale sweep recovers it.
_STUCK_WHERE = """
FROM channel_message
WHERE status IN ('failed', 'partial_failed', 'uncertain')
   OR (status = 'sending' AND sending_since < now() - make_interval(secs => :stale_s))
"""


async def stuck_messages(
    session: AsyncSession, settings: DeliverySettings, *, limit: int
) -> tuple[list[StuckMessage], int]:
    """Failed, uncertain and overdue messages, oldest first, and how many there are in all."""
    params = {"stale_s": settings.stale_after_s, "limit": limit}
    total = int(await session.scalar(text("SELECT count(*) " + _STUCK_WHERE), params) or 0)
    rows = await session.execute(
        text(
            "SELECT id, channel, account, status, attempts, last_error, "
            "COALESCE(sending_since, created_at) AS since "
            + _STUCK_WHERE
            + " ORDER BY since, id LIMIT :limit"
        ),
        params,
    )
    items = [
        StuckMessage(
            id=row.id,
            channel=row.channel,
            account=row.account,
            status=row.status,
            attempts=row.attempts,
            reason=_reason(row.status, row.last_error),
            since=row.since,
        )
        for row in rows
    ]
    return items, total


def _reason(status: str, last_error: str | None) -> str:
    if status == "sending":
        return "sending for longer than stale_after_s (the stale sweep will recover it)"
    if status == "uncertain" and not last_error:
        return "a send may or may not have arrived; replay sends it again"
    return (last_error or status).replace("\n", " ")[:REASON_CHARS]
