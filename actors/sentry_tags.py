"""Tags each message's Sentry scope with its actor, queue and the id it works on."""

from __future__ import annotations

from typing import Any

from dramatiq import Broker, Middleware
from dramatiq.broker import MessageProxy

#: Which argument names the record an actor works on, and the tag it goes under.
ID_TAGS = {
    "poll_mailbox": "mailbox",
    "map_recognition_result": "job_id",
    "deliver_channel_message": "message_id",
}


class SentryTags(Middleware):
    """Sets tags on the scope the Sentry integration opened for this message (a no-op without Sentry)."""

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        import sentry_sdk

        if not sentry_sdk.get_client().is_active():
            return
        sentry_sdk.set_tag("actor", message.actor_name)
        sentry_sdk.set_tag("queue", message.queue_name)
        sentry_sdk.set_tag("message_id", message.message_id)
        tag = ID_TAGS.get(message.actor_name)
        args: Any = message.args
        if tag is not None and args:
            sentry_sdk.set_tag(tag, str(args[0])[:200])
