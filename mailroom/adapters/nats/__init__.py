"""NATS adapter: connection, request publishing (core or JetStream), result subscriptions.

nats-py errors stop here and leave as ``mailroom.errors`` types (``translate``).
The outbox needs only ``RequestPublisher`` (met by ``NatsClient`` and
``InMemoryPublisher``, in ``publisher``); the bridge needs
``NatsClient.subscribe_results``, which hides whether results come from a core
queue group or a durable JetStream pull consumer (``subscriptions``).
"""

from mailroom.adapters.nats.websocket import import_nats

# Before nats-py is first imported: aiohttp waits until a websocket link uses it (websocket.py).
import_nats()

from mailroom.adapters.nats.client import NatsClient  # noqa: E402
from mailroom.adapters.nats.publisher import (  # noqa: E402
    InMemoryPublisher,
    OutgoingMessage,
    PublishAck,
    PublishResult,
    RequestPublisher,
)
from mailroom.adapters.nats.subscriptions import IncomingMessage, ResultSubscription  # noqa: E402

__all__ = [
    "InMemoryPublisher",
    "IncomingMessage",
    "NatsClient",
    "OutgoingMessage",
    "PublishAck",
    "PublishResult",
    "RequestPublisher",
    "ResultSubscription",
]
