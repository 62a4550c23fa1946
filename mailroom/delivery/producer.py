"""Producing channel messages: a row in the caller's transaction, a stream entry after commit.

The stream entry is only a wake-up call carrying the id; Postgres holds the
message. A crash between commit and XADD leaves ``enqueued_at`` NULL, and the
re-add sweep (``readd_pending_deliveries``) puts such messages on the stream.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import and_, or_, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.redis import DeliveryRedis
from mailroom.db.clock import db_after
from mailroom.db.engine import autocommit, transaction
from mailroom.db.models import ChannelMessage
from mailroom.settings import DeliverySettings

logger = logging.getLogger(__name__)


async def create_message(
    session: AsyncSession,
    *,
    channel: str,
    recipient: str,
    body: str,
    account: str = "default",
    subject: str | None = None,
    dedupe_key: str | None = None,
    mail_id: int | None = None,
    document_id: int | None = None,
) -> int | None:
    """Insert a pending message in the caller's transaction; returns its id.

    With a ``dedupe_key`` already used, nothing is inserted and None is returned
    (the earlier message stands). Call ``enqueue_messages`` after the commit.
    """
    ids = await create_messages(
        session,
        [
            {
                "channel": channel,
                "account": account,
                "recipient": recipient,
                "subject": subject,
                "body": body,
                "dedupe_key": dedupe_key,
                "mail_id": mail_id,
                "document_id": document_id,
            }
        ],
    )
    return ids[0] if ids else None


#: Pending messages from one JSON array: a statement compiled once, whatever the count (an
#: ORM multi-row insert is built anew for each count, with a parameter per value).
_INSERT_MESSAGES = text(
    """
    INSERT INTO channel_message (channel, account, recipient, subject, body, dedupe_key,
                                 mail_id, document_id, status)
    SELECT r.channel, COALESCE(r.account, 'default'), r.recipient, r.subject, r.body,
           r.dedupe_key, r.mail_id, r.document_id, 'pending'
      FROM json_to_recordset(CAST(:messages AS json))
           AS r(channel text, account text, recipient text, subject text, body text,
                dedupe_key text, mail_id bigint, document_id bigint)
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id
    """
)

_MARK_ENQUEUED = text("UPDATE channel_message SET enqueued_at = now() WHERE id = ANY(:ids)")


async def create_messages(session: AsyncSession, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Insert pending messages (``ChannelMessage`` columns) in the caller's transaction.

    Returns the ids of the new ones in ascending order; a message whose ``dedupe_key``
    is already used inserts nothing (the earlier one stands). One statement for all.
    Call ``enqueue_messages`` after the commit.
    """
    if not messages:
        return []
    rows = await session.execute(_INSERT_MESSAGES, {"messages": json.dumps(list(messages))})
    return sorted(message_id for (message_id,) in rows)


async def add_to_stream(
    redis: aioredis.Redis, message_ids: Sequence[int], *, settings: DeliverySettings
) -> None:
    """XADD the ids (one pipeline), trimming the stream to about ``stream_maxlen``."""
    await DeliveryRedis(redis, stream_key=settings.stream_key).add_to_stream(
        message_ids, maxlen=settings.stream_maxlen
    )


async def enqueue_messages(
    message_ids: Sequence[int],
    *,
    redis: aioredis.Redis,
    sessions: async_sessionmaker[AsyncSession],
    settings: DeliverySettings,
) -> None:
    """After the commit that created them: XADD the ids, then record ``enqueued_at``."""
    ids = [mid for mid in message_ids if mid is not None]
    if not ids:
        return
    await add_to_stream(redis, ids, settings=settings)
    # One statement: in autocommit, no BEGIN and COMMIT round trips around it.
    async with autocommit(sessions) as connection:
        await connection.execute(_MARK_ENQUEUED, {"ids": ids})


async def readd_pending_messages(
    *,
    sessions: async_sessionmaker[AsyncSession],
    redis: aioredis.Redis,
    settings: DeliverySettings,
) -> list[int]:
    """Put pending messages back on the stream that never got there or were lost on the way.

    Candidates: pending and never added (``enqueued_at`` NULL), or added and due
    for longer than ``readd_after_s`` with no live processing lock. Returns the ids.
    """
    threshold = db_after(-settings.readd_after_s)
    async with transaction(sessions) as session:
        rows = await session.execute(
            select(ChannelMessage.id)
            .where(
                ChannelMessage.status == "pending",
                or_(
                    ChannelMessage.enqueued_at.is_(None),
                    and_(
                        ChannelMessage.enqueued_at < threshold,
                        or_(
                            ChannelMessage.next_retry_at.is_(None),
                            ChannelMessage.next_retry_at < threshold,
                        ),
                    ),
                ),
            )
            .order_by(ChannelMessage.id)
            .limit(settings.sweep_batch_size)
        )
        candidates = [row[0] for row in rows]
    if not candidates:
        return []
    keys = DeliveryRedis(redis, stream_key=settings.stream_key)
    locked = await keys.live_locks(candidates)
    ids = [mid for mid in candidates if mid not in locked]
    await enqueue_messages(ids, redis=redis, sessions=sessions, settings=settings)
    if ids:
        logger.info("Re-added %d pending delivery message(s) to the stream", len(ids))
    return ids
