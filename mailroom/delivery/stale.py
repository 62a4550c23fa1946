"""Stale recovery: messages stuck in ``sending`` with nobody holding their lock.

A worker died mid-send, so the provider may or may not have the chunk in
flight. Idempotent channels (the receiver dedupes on the Idempotency-Key) are
simply sent again; any other channel ends ``uncertain`` with a stored reason and
one audit event, never a silent resend. A message whose delivered key says it
was delivered (Postgres failed right after the send) is settled as delivered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.redis import DeliveryRedis, translate_errors
from mailroom.db.clock import db_after
from mailroom.db.engine import transaction
from mailroom.db.models import ChannelMessage
from mailroom.delivery import metrics
from mailroom.delivery.producer import enqueue_messages
from mailroom.delivery.statements import UNCERTAIN_ERROR, stale_recovered_event
from mailroom.settings import DeliverySettings

logger = logging.getLogger(__name__)


@dataclass
class StaleRecovery:
    """What one pass did, by message id."""

    uncertain: list[int] = field(default_factory=list)
    resent: list[int] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)


async def recover_stale_deliveries(
    *,
    sessions: async_sessionmaker[AsyncSession],
    redis: aioredis.Redis,
    settings: DeliverySettings,
    is_idempotent: Callable[[str], bool],
) -> StaleRecovery:
    """Settle messages in ``sending`` for longer than ``stale_after_s`` without a live lock.

    Candidates are read without locks, then Redis (live locks and delivered keys)
    in one pipelined call, and only then are the rows locked: a slow Redis never
    holds row locks, and a pass makes one read round trip however many rows it has.
    """
    keys = DeliveryRedis(redis, stream_key=settings.stream_key)
    threshold = db_after(-settings.stale_after_s)
    result = StaleRecovery()
    stale = (ChannelMessage.status == "sending", ChannelMessage.sending_since < threshold)
    async with sessions() as session:
        candidates = list(
            (
                await session.execute(
                    select(ChannelMessage.id)
                    .where(*stale)
                    .order_by(ChannelMessage.id)
                    .limit(settings.sweep_batch_size)
                )
            ).scalars()
        )
    if not candidates:
        return result
    states = await _redis_states(keys, candidates)
    unlocked = [mid for mid in candidates if states[mid] != "locked"]
    if not unlocked:
        return result
    async with transaction(sessions) as session:
        # NOTE: the row lock re-checks the status: a message settled meanwhile drops out.
        rows = (
            await session.execute(
                select(ChannelMessage.id, ChannelMessage.channel)
                .where(ChannelMessage.id.in_(unlocked), *stale)
                .order_by(ChannelMessage.id)
                .with_for_update(skip_locked=True)
            )
        ).all()
        for row in rows:
            if states[row.id] == "delivered":
                result.delivered.append(row.id)
            elif is_idempotent(row.channel):
                result.resent.append(row.id)
            else:
                result.uncertain.append(row.id)
        if result.delivered:
            await session.execute(
                update(ChannelMessage)
                .where(ChannelMessage.id.in_(result.delivered), *stale)
                .values(status="delivered", delivered_at=func.now(), last_error=None)
            )
        if result.resent:
            await session.execute(
                update(ChannelMessage)
                .where(ChannelMessage.id.in_(result.resent), *stale)
                .values(status="pending", next_retry_at=None, enqueued_at=None)
            )
        if result.uncertain:
            await session.execute(
                update(ChannelMessage)
                .where(ChannelMessage.id.in_(result.uncertain), *stale)
                .values(status="uncertain", last_error=UNCERTAIN_ERROR, next_retry_at=None)
            )
        if result.uncertain or result.resent:
            session.add(
                stale_recovered_event(
                    result.uncertain, found_by="stale_recovery", resent=len(result.resent)
                )
            )
    # After the commit: settled keys so late duplicates stop at the fast path, re-sends on the stream.
    await keys.settle_many(
        [(mid, "uncertain") for mid in result.uncertain],
        token="",
        delivered_ttl_s=settings.delivered_ttl_s,
    )
    await enqueue_messages(result.resent, redis=redis, sessions=sessions, settings=settings)
    for outcome, ids in (
        ("uncertain", result.uncertain),
        ("resent", result.resent),
        ("delivered", result.delivered),
    ):
        if ids:
            metrics.STALE_RECOVERED.labels(outcome).inc(len(ids))
            logger.warning("Stale recovery: %d message(s) %s: %s", len(ids), outcome, ids[:20])
    return result


async def _redis_states(keys: DeliveryRedis, message_ids: list[int]) -> dict[int, str]:
    """Per message: ``locked`` (a live processing lock), ``delivered`` or ``""``; one round trip."""
    async with translate_errors():
        pipe = keys.client.pipeline(transaction=False)
        for message_id in message_ids:
            pipe.exists(keys.keys.lock(message_id))
            pipe.get(keys.keys.delivered(message_id))
        replies = await pipe.execute()
    states: dict[int, str] = {}
    for index, message_id in enumerate(message_ids):
        locked, delivered = replies[2 * index], replies[2 * index + 1]
        states[message_id] = (
            "locked" if locked else "delivered" if delivered == b"delivered" else ""
        )
    return states
