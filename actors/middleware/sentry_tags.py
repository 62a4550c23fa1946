"""Tags each message's Sentry scope with its actor, queue and the record it works on."""

from __future__ import annotations

from typing import Any

from dramatiq import Broker, Middleware
from dramatiq.broker import MessageProxy

from mailroom.process.observability import active_sentry

#: Which argument names the record an actor works on, and the tag it goes under.
ID_TAGS = {
    "poll_mailbox": "mailbox",
    "map_recognition_result": "job_id",
    "map_recognition_results": "job_ids",
    "deliver_channel_message": "channel_message_id",
    "deliver_channel_messages": "channel_message_ids",
}
#: Longest tag value Sentry keeps, in characters.
TAG_CHARS = 200


def message_tags(message: Any) -> dict[str, str]:
    """The actor, queue, Dramatiq message id and record id of ``message`` (never its payload)."""
    tags = {
        "actor": message.actor_name,
        "queue": message.queue_name,
        "message_id": message.message_id,
    }
    tag = ID_TAGS.get(message.actor_name)
    args: Any = message.args
    if tag is not None and args:
        tags[tag] = str(args[0])[:TAG_CHARS]
    return tags


class SentryTags(Middleware):
    """Sets tags on the scope the Sentry integration opened for this message (a no-op without Sentry)."""

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        sentry_sdk = active_sentry()
        if sentry_sdk is None:
            return
        sentry_sdk.set_tags(message_tags(message))
