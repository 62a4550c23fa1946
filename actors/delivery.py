"""Delivery actors: send one channel message, recover stale sends, re-add pending ones."""

from __future__ import annotations

import dramatiq

from actors import queues
from actors.retry_policy import RetryPolicy


@dramatiq.actor(queue_name=queues.DELIVERY, retry_policy=RetryPolicy(max_attempts=None))
async def deliver_channel_message(message_id: int) -> None:
    """Deliver one channel message (DESIGN.md §6)."""
    raise NotImplementedError("owned by the delivery engineer")


@dramatiq.actor(queue_name=queues.MAINTENANCE, retry_policy=RetryPolicy(max_attempts=1))
async def recover_stale_deliveries() -> None:
    """Settle messages stuck in ``sending`` (DESIGN.md §6)."""
    raise NotImplementedError("owned by the delivery engineer")


@dramatiq.actor(queue_name=queues.MAINTENANCE, retry_policy=RetryPolicy(max_attempts=1))
async def readd_pending_deliveries() -> None:
    """XADD pending messages that never reached the stream."""
    raise NotImplementedError("owned by the delivery engineer")
