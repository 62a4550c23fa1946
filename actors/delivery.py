"""Delivery actors: send channel messages (one or a batch), recover stale sends, re-add pending."""

from __future__ import annotations

import asyncio
import logging
import weakref

import dramatiq
from pydantic import PositiveInt, TypeAdapter, ValidationError

from actors import queues
from actors.middleware.resources import Resources, current
from actors.middleware.retry_policy import RetryPolicy
from mailroom import queues as actor_names
from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.deliver import Deliverer
from mailroom.delivery.producer import readd_pending_messages
from mailroom.delivery.stale import recover_stale_deliveries as recover_stale
from mailroom.errors import AppError, DeliveryDeferred, PermanentError

logger = logging.getLogger(__name__)

_MESSAGE_IDS = TypeAdapter(list[PositiveInt])

# Attempts are counted in Postgres (``max_attempts`` of the delivery settings), so Dramatiq
# itself retries forever; ``DeliveryDeferred`` carries the wait it should use.
#: One deliverer per worker's resources (its clients live on that worker's event loop).
_deliverers: weakref.WeakKeyDictionary[Resources, Deliverer] = weakref.WeakKeyDictionary()


async def _deliverer() -> Deliverer:
    resources = current()
    deliverer = _deliverers.get(resources)
    if deliverer is None:
        settings = resources.settings.delivery
        outbound = await resources.channels()
        deliverer = _deliverers[resources] = Deliverer(
            sessions=await resources.sessions(),
            redis=DeliveryRedis(await resources.redis(), stream_key=settings.stream_key),
            outbound=outbound,
            settings=settings,
            refresh_accounts=outbound.refresh,
        )
    return deliverer


@dramatiq.actor(queue_name=queues.DELIVERY, retry_policy=RetryPolicy(max_attempts=None))
async def deliver_channel_message(message_id: int) -> None:
    """Deliver one channel message (ARCHITECTURE.md, Delivery)."""
    await (await _deliverer()).deliver(int(message_id))


@dramatiq.actor(
    **actor_names.DELIVER_CHANNEL_MESSAGES.declared, retry_policy=RetryPolicy(max_attempts=None)
)
async def deliver_channel_messages(message_ids: list[int]) -> None:
    """Deliver a batch of channel messages (the stream bridge sends one per read).

    A message that must run again is sent on as its own ``deliver_channel_message``
    with its own delay, so it never holds back or repeats its neighbours.
    """
    try:
        ids = _MESSAGE_IDS.validate_python(message_ids)
    except ValidationError as exc:
        raise PermanentError(f"invalid message ids: {exc.error_count()} error(s)") from exc
    result = await (await _deliverer()).deliver_many(ids)
    if result.retries:
        await asyncio.to_thread(_send_retries, result.retries)


def _send_retries(retries: dict[int, Exception]) -> None:
    policy = deliver_channel_message.options["retry_policy"]
    for message_id, error in retries.items():
        if isinstance(error, DeliveryDeferred):
            delay_ms = error.retry_after_ms
        else:
            delay_ms = policy.backoff_ms(0)
            logger.log(
                logging.WARNING if isinstance(error, AppError) else logging.ERROR,
                "Delivery of message %s failed; retrying it alone in %d ms",
                message_id,
                delay_ms,
                exc_info=error,
            )
        deliver_channel_message.send_with_options(args=(message_id,), delay=delay_ms)


@dramatiq.actor(
    **actor_names.RECOVER_STALE_DELIVERIES.declared, retry_policy=RetryPolicy(max_attempts=1)
)
async def recover_stale_deliveries() -> None:
    """Settle messages stuck in ``sending`` (ARCHITECTURE.md, Delivery)."""
    resources = current()
    outbound = await resources.channels()
    await recover_stale(
        sessions=await resources.sessions(),
        redis=await resources.redis(),
        settings=resources.settings.delivery,
        is_idempotent=outbound.is_idempotent,
    )


@dramatiq.actor(
    **actor_names.READD_PENDING_DELIVERIES.declared, retry_policy=RetryPolicy(max_attempts=1)
)
async def readd_pending_deliveries() -> None:
    """XADD pending messages that never reached the stream."""
    resources = current()
    await readd_pending_messages(
        sessions=await resources.sessions(),
        redis=await resources.redis(),
        settings=resources.settings.delivery,
    )
