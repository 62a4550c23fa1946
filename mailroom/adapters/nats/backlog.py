"""What waits in the inbox's JetStream consumer, and how long since it last delivered.

The recognition gate reads this: answers (acks and results) that sit in the
consumer while no NATS bridge takes them are answers Mailroom has not read, so no
job may be judged unanswered. Both times come from the NATS server's clock (its
``ts`` beside the consumer's ``last_active``), never compared with another clock.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

import nats.errors
from nats.aio.client import Client as NatsConnection

from mailroom.settings import NatsSettings

logger = logging.getLogger(__name__)

#: The JetStream API's subject prefix (no domain: Mailroom's stream lives in its account).
JS_API = "$JS.API"


@dataclass(frozen=True)
class InboxBacklog:
    """The inbox consumer's answers not yet acked by a bridge."""

    #: Messages not delivered yet plus delivered and not acked.
    waiting: int
    #: Since the consumer last delivered a message (or was created), by the server's clock.
    idle_s: float
    #: Pull requests waiting for messages: a live bridge keeps one open while it has room.
    pulls: int = 0


async def read_inbox_backlog(nc: NatsConnection, settings: NatsSettings) -> InboxBacklog | None:
    """The backlog of ``settings.inbox_durable``; None when it does not exist or cannot be read.

    Unknown is not evidence: the gate decides on its other signals then (an unreachable
    NATS holds every pipeline by itself).
    """
    subject = f"{JS_API}.CONSUMER.INFO.{settings.stream_name}.{settings.inbox_durable}"
    try:
        reply = await nc.request(subject, b"", timeout=settings.publish_timeout_s)
        info = json.loads(reply.data)
    except (TimeoutError, nats.errors.Error, OSError, ValueError) as exc:
        logger.debug("Inbox consumer info not read: %s", type(exc).__name__)
        return None
    return backlog_of(info)


def backlog_of(info: dict[str, object]) -> InboxBacklog | None:
    """The backlog in a ``CONSUMER.INFO`` reply; None for an error reply or no server time."""
    if "error" in info or not isinstance(info.get("ts"), str):
        return None
    delivered = info.get("delivered")
    last = delivered.get("last_active") if isinstance(delivered, dict) else None
    since = last if isinstance(last, str) else info.get("created")
    if not isinstance(since, str):
        return None
    waiting = int(str(info.get("num_pending") or 0)) + int(str(info.get("num_ack_pending") or 0))
    idle_s = (_parse(str(info["ts"])) - _parse(since)).total_seconds()
    pulls = int(str(info.get("num_waiting") or 0))
    return InboxBacklog(waiting=waiting, idle_s=max(0.0, idle_s), pulls=pulls)


def _parse(stamp: str) -> datetime:
    """An RFC 3339 time of the server (nanoseconds cut to microseconds, ``Z`` as UTC)."""
    stamp = stamp.replace("Z", "+00:00")
    head, dot, rest = stamp.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        stamp = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    return datetime.fromisoformat(stamp)
