"""NATS adapter: connection, request publishing (core or JetStream), result subscriptions.

nats-py errors stop here and leave as ``mailroom.errors`` types (``translate``).
The outbox needs only ``RequestPublisher`` (met by ``NatsClient`` and
``InMemoryPublisher``, in ``publisher``); the bridge needs
``NatsClient.subscribe_results``, which hides whether results come from a core
queue group or a durable JetStream pull consumer (``subscriptions``).
"""

from mailroom.adapters.nats.client import NatsClient
from mailroom.adapters.nats.publisher import (
    InMemoryPublisher,
    OutgoingMessage,
    PublishAck,
    PublishResult,
    RequestPublisher,
)
from mailroom.adapters.nats.subscriptions import IncomingMessage, ResultSubscription

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
