"""Notification actor: final mails → channel messages on the delivery stream."""

from __future__ import annotations

import time

import dramatiq

from actors.broker.sending import send_off_loop
from actors.middleware.resources import current
from actors.middleware.retry_policy import RetryPolicy
from mailroom import queues as actor_names
from mailroom.config_store import effective
from mailroom.notifications import passes as notifications

#: This process's routes, re-read only when the route rows change.
_ROUTES = effective.runtime_routes()


#: How long one message keeps taking passes while more final mails wait, in seconds. A pass
#: re-sent for each batch of a backlog waited behind the mapping queue's batches every time.
BACKLOG_BUDGET_S = 5.0


@dramatiq.actor(
    **actor_names.NOTIFY_FINAL_MAILS.declared, retry_policy=RetryPolicy(max_attempts=10)
)
async def notify_final_mails(settle: bool = True) -> None:
    """Create and enqueue the notifications of mails that became final (ARCHITECTURE.md, Notifications).

    Passes follow each other (each its own transaction) while mails wait, for up to
    ``BACKLOG_BUDGET_S``; what is left then gets a pass request of its own. With
    ``settle`` (sweeps, operators) each pass also finalizes settled stored mails; a
    requested pass does when a request asked for it (``request_notification_pass``).
    """
    resources = current()
    sessions = await resources.sessions()
    redis = await resources.redis()
    deadline = time.monotonic() + BACKLOG_BUDGET_S
    more = True
    while more and time.monotonic() < deadline:
        # Routes per pass: their version check is one read, and a route changed meanwhile counts.
        _, more = await notifications.notify_final_mails(
            sessions=sessions,
            redis=redis,
            settings=await _ROUTES.get(
                sessions,
                resources.settings.delivery,
                resources.settings.runtime_config.key.get_secret_value(),
            ),
            settle=bool(settle),
        )
    if more:
        await request_notification_pass(settle=False)


async def request_notification_pass(*, settle: bool = True) -> None:
    """Send ``notify_final_mails`` unless a pass is already queued and not yet started.

    ``settle=False`` when the caller made its mails final itself (a recognition finisher):
    the pass then skips looking for settled stored mails, unless another request asked.
    """
    resources = current()
    redis = await resources.redis()
    delivery = resources.settings.delivery
    marked = not settle or await notifications.request_settle(redis, delivery)
    if await notifications.request_pass(redis, delivery) or not marked:
        await send_off_loop(notify_final_mails, not marked)
