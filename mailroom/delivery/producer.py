"""Producing channel messages: a row in the caller's transaction, a stream entry after commit.

The stream entry is only a wake-up call carrying the id; Postgres holds the
message. A crash between commit and XADD leaves ``enqueued_at`` NULL, and the
re-add sweep (``readd_pending_deliveries``) puts such messages on the stream.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.redis import DeliveryRedis
from mailroom.clock import db_after
from mailroom.db import transaction
from mailroom.models import ChannelMessage
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


#: Messages inserted per statement (up to 10 parameters each; a statement takes at most 32767).
INSERT_CHUNK = 1_000


async def create_messages(session: AsyncSession, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Insert pending messages (``ChannelMessage`` columns) in the caller's transaction.

    Returns the ids of the new ones in ascending order; a message whose ``dedupe_key``
    is already used inserts nothing (the earlier one stands). A chunk per statement.
    Call ``enqueue_messages`` after the commit.
    """
    ids: list[int] = []
    for start in range(0, len(messages), INSERT_CHUNK):
        statement = (
            insert(ChannelMessage)
            .values([{**m, "status": "pending"} for m in messages[start : start + INSERT_CHUNK]])
            .on_conflict_do_nothing(index_elements=["dedupe_key"])
            .returning(ChannelMessage.id)
        )
        ids += sorted(message_id for (message_id,) in await session.execute(statement))
    return ids


async def add_to_stream(
    redis: aioredis.Redis, message_ids: Sequence[int], *, settings: DeliverySettings
) -> None:
    """XADD the ids (one pipeline), trimming the stream to about ``stream_maxlen``."""
    await DeliveryRedis(redis, stream_key=settings.stream_key).add_to_stream(
        message_ids, maxlen=settings.stream_maxlen
    )


async def mark_enqueued(session: AsyncSession, message_ids: Sequence[int]) -> None:
    """Record when the messages were put on the stream."""
    if message_ids:
        await session.execute(
            update(ChannelMessage)
            .where(ChannelMessage.id.in_(list(message_ids)))
            .values(enqueued_at=func.now())
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
    async with transaction(sessions) as session:
        await mark_enqueued(session, ids)


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
