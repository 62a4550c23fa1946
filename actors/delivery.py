"""Delivery actors: send one channel message, recover stale sends, re-add pending ones."""

from __future__ import annotations

import weakref

import dramatiq

from actors import queues
from actors.resources import Resources, current
from actors.retry_policy import RetryPolicy
from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.deliver import Deliverer
from mailroom.delivery.producer import readd_pending_messages
from mailroom.delivery.stale import recover_stale_deliveries as recover_stale

# Attempts are counted in Postgres (``max_attempts`` of the delivery settings), so Dramatiq
# itself retries forever; ``DeliveryDeferred`` carries the wait it should use.
#: One deliverer per worker's resources (its clients live on that worker's event loop).
_deliverers: weakref.WeakKeyDictionary[Resources, Deliverer] = weakref.WeakKeyDictionary()


async def _deliverer() -> Deliverer:
    resources = current()
    deliverer = _deliverers.get(resources)
    if deliverer is None:
        settings = resources.settings.delivery
        deliverer = _deliverers[resources] = Deliverer(
            sessions=await resources.sessions(),
            redis=DeliveryRedis(await resources.redis(), stream_key=settings.stream_key),
            outbound=await resources.channels(),
            settings=settings,
        )
    return deliverer


@dramatiq.actor(queue_name=queues.DELIVERY, retry_policy=RetryPolicy(max_attempts=None))
async def deliver_channel_message(message_id: int) -> None:
    """Deliver one channel message (DESIGN.md §6)."""
    await (await _deliverer()).deliver(int(message_id))


@dramatiq.actor(queue_name=queues.MAINTENANCE, retry_policy=RetryPolicy(max_attempts=1))
async def recover_stale_deliveries() -> None:
    """Settle messages stuck in ``sending`` (DESIGN.md §6)."""
    resources = current()
    outbound = await resources.channels()
    await recover_stale(
        sessions=await resources.sessions(),
        redis=await resources.redis(),
        settings=resources.settings.delivery,
        is_idempotent=outbound.is_idempotent,
    )


@dramatiq.actor(queue_name=queues.MAINTENANCE, retry_policy=RetryPolicy(max_attempts=1))
async def readd_pending_deliveries() -> None:
    """XADD pending messages that never reached the stream."""
    resources = current()
    await readd_pending_messages(
        sessions=await resources.sessions(),
        redis=await resources.redis(),
        settings=resources.settings.delivery,
    )
