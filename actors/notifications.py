"""Notification actor: final mails → channel messages on the delivery stream."""

from __future__ import annotations

import dramatiq

from actors import queues
from actors.resources import current
from actors.retry_policy import RetryPolicy
from actors.sending import send_off_loop
from mailroom import notifications
from mailroom.config_store import effective


@dramatiq.actor(queue_name=queues.MAPPING, retry_policy=RetryPolicy(max_attempts=10))
async def notify_final_mails() -> None:
    """Create and enqueue the notifications of mails that became final (ARCHITECTURE.md, Notifications)."""
    resources = current()
    _, more = await notifications.notify_final_mails(
        sessions=await resources.sessions(),
        redis=await resources.redis(),
        settings=await effective.delivery_routes(
            await resources.sessions(),
            resources.settings.delivery,
            resources.settings.runtime_config.key.get_secret_value(),
        ),
    )
    if more:
        await send_off_loop(notify_final_mails)
