"""Flow control's nudge: who runs the publisher again when acks free places in a window.

The outbox publishes at most ``max_unacked_per_pipeline`` requests of a pipeline that
are not yet acked or answered (outbox.py); the rest wait ``queued``. When acks or
results free places, the inbox actors send a publish pass, but only while a window
may hold jobs back: a pass that leaves a window full marks it in Redis for
``WAITING_TTL_S`` (each such pass renews it), so an inbox batch pays one Redis read,
not a pass, when nothing waits. The mark is never cleared, only left to expire: a
pass that clears it could race one that sets it, and a stale mark costs a few empty
passes at the end of a backlog. The scheduler's outbox sweep stays the safety net.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from mailroom.settings import NatsSettings

logger = logging.getLogger(__name__)

#: How long a full window's mark lives, in seconds; well above the outbox sweep's interval
#: (10 s), so passes renew it while the window stays full.
WAITING_TTL_S = 60

#: Inbox outcomes that took a job out of ``published`` (or may have): places freed.
FREEING_OUTCOMES = frozenset({"ack_applied", "result_applied"})


def waiting_key(nats: NatsSettings) -> str:
    """The Redis key of the mark, one per deployment (its stream)."""
    return f"mailroom:{nats.stream_name}:recognition-window-full"


def frees_places(applied: Iterable[str]) -> bool:
    """True when one of these inbox outcomes acked or answered a job."""
    return any(outcome in FREEING_OUTCOMES for outcome in applied)


async def mark_waiting(redis: aioredis.Redis, nats: NatsSettings) -> None:
    """A pass left a window full: jobs may wait for places acks will free."""
    try:
        await redis.set(waiting_key(nats), "1", ex=WAITING_TTL_S)
    except RedisError as exc:  # the inbox then nudges anyway (see may_be_waiting)
        logger.warning("Full recognition window not recorded: %s", exc)


async def may_be_waiting(redis: aioredis.Redis, nats: NatsSettings) -> bool:
    """Whether queued jobs may wait behind a full window; True when Redis cannot say.

    A pass too many costs less than jobs left waiting for the sweep.
    """
    try:
        return bool(await redis.exists(waiting_key(nats)))
    except RedisError as exc:
        logger.warning("Recognition window mark not read (%s); nudging the publisher", exc)
        return True
