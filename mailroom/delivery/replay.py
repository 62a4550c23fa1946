"""Replay: put failed, uncertain or partially failed messages back to pending (audit-logged).

Sent chunks stay recorded, so a partially failed message resumes at its first
unsent chunk; attempts start over. The delivered keys are dropped and the ids
re-added to the stream after the commit.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.redis import DeliveryRedis
from mailroom.db.engine import transaction
from mailroom.db.models import AuditEvent, ChannelMessage
from mailroom.delivery.producer import enqueue_messages
from mailroom.errors import NotReplayable
from mailroom.settings import DeliverySettings

logger = logging.getLogger(__name__)

#: Statuses an operator may replay.
REPLAYABLE = ("failed", "uncertain", "partial_failed")


async def replay_messages(
    *,
    sessions: async_sessionmaker[AsyncSession],
    redis: aioredis.Redis,
    settings: DeliverySettings,
    actor_id: str,
    message_id: int | None = None,
    status: str | None = None,
    limit: int = 100,
) -> list[int]:
    """Replay one message (``message_id``) or up to ``limit`` in ``status``; returns the ids."""
    if (message_id is None) == (status is None):
        raise ValueError("give exactly one of message_id and status")
    if status is not None and status not in REPLAYABLE:
        raise NotReplayable(f"status {status!r} cannot be replayed; use one of {REPLAYABLE}")
    async with transaction(sessions) as session:
        query = select(ChannelMessage.id, ChannelMessage.status).with_for_update(skip_locked=True)
        if message_id is not None:
            query = query.where(ChannelMessage.id == message_id)
        else:
            query = query.where(ChannelMessage.status == status).order_by(ChannelMessage.id)
            query = query.limit(limit)
        rows = (await session.execute(query)).all()
        if message_id is not None:
            if not rows:
                raise NotReplayable(f"message {message_id} does not exist or is busy")
            if rows[0].status not in REPLAYABLE:
                raise NotReplayable(f"message {message_id} is {rows[0].status}, not replayable")
        ids = [row.id for row in rows]
        if ids:
            await session.execute(
                update(ChannelMessage)
                .where(ChannelMessage.id.in_(ids))
                .values(
                    status="pending",
                    attempts=0,
                    next_retry_at=None,
                    enqueued_at=None,
                    sending_since=None,
                )
            )
            session.add_all(
                AuditEvent(
                    actor_type="operator",
                    actor_id=actor_id[:200],
                    action="delivery.replayed",
                    target=f"channel_message:{row.id}",
                    detail={"previous_status": row.status},
                )
                for row in rows
            )
    await DeliveryRedis(redis, stream_key=settings.stream_key).forget_settled(ids)
    await enqueue_messages(ids, redis=redis, sessions=sessions, settings=settings)
    logger.info("Replayed %d delivery message(s) by %r", len(ids), actor_id[:100])
    return ids
