"""Request publishing: the messages, their confirmation (core or JetStream), and a fake.

The outbox needs only ``RequestPublisher``, met by ``NatsClient`` (which hands its
connection to ``publish_core`` or ``publish_jetstream``) and ``InMemoryPublisher``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from nats.aio.client import Client as NatsConnection
from nats.js import JetStreamContext
from nats.js.api import PubAck

from mailroom.adapters.nats.translate import translate_errors
from mailroom.errors import NatsPublishFailed, PermanentError, RetryableError
from mailroom.recognition.contract.models import MSG_ID_HEADER
from mailroom.service.wire import flushed


# NOTE: named tuples, not frozen dataclasses: an outbox pass makes two per request, and a
# frozen dataclass sets each field through object.__setattr__ (about four times the cost).
class OutgoingMessage(NamedTuple):
    """One message to publish, with its stable dedupe key."""

    subject: str
    data: bytes
    msg_id: str


class PublishAck(NamedTuple):
    """Proof that a message left: core NATS flush, or a JetStream ack."""

    msg_id: str
    #: JetStream saw this ``Nats-Msg-Id`` within its duplicate window and dropped the copy.
    duplicate: bool = False
    stream: str | None = None
    seq: int | None = None


#: Per message of a batch, in order: its ack, or the error that kept it from being confirmed.
PublishResult = PublishAck | RetryableError | PermanentError


class RequestPublisher(Protocol):
    """What the outbox needs from NATS."""

    @property
    def is_connected(self) -> bool: ...

    async def publish_batch(self, messages: Sequence[OutgoingMessage]) -> list[PublishResult]:
        """Publish ``messages`` in order and confirm them; never raises for one message."""
        ...


async def publish_core(
    nc: NatsConnection, messages: Sequence[OutgoingMessage], *, timeout_s: float
) -> list[PublishResult]:
    """Publish on core NATS, then one flush confirms the whole batch."""
    sent = 0
    try:
        # One translating block for the batch, not one per message: its cost was a tenth of
        # the publish; the error still names the message it stopped at.
        with translate_errors(lambda: f"publish {messages[sent].msg_id}"):
            for message in messages:
                await nc.publish(
                    message.subject, message.data, headers={MSG_ID_HEADER: message.msg_id}
                )
                sent += 1
    except (RetryableError, PermanentError) as exc:
        # Later messages were never handed over: they share this error.
        acked: list[PublishResult] = [PublishAck(m.msg_id) for m in messages[:sent]]
        return acked + [exc] * (len(messages) - sent)
    results: list[PublishResult] = [PublishAck(message.msg_id) for message in messages]
    try:
        with translate_errors("flush"):
            # A PONG proves the server read everything written before the PING.
            await flushed(nc, timeout_s)
    except (RetryableError, PermanentError) as exc:
        return [exc] * len(messages)
    return results


async def publish_jetstream(
    js: JetStreamContext, messages: Sequence[OutgoingMessage], *, stream: str, timeout_s: float
) -> list[PublishResult]:
    """Publish to ``stream`` without waiting, then wait for all the acks at once."""
    futures: list[asyncio.Future[PubAck]] = []
    failed: RetryableError | PermanentError | None = None
    for message in messages:
        try:
            with translate_errors(f"publish {message.msg_id}"):
                pending_ack = await js.publish_async(
                    message.subject,
                    message.data,
                    stream=stream,
                    headers={MSG_ID_HEADER: message.msg_id},
                )
        except (RetryableError, PermanentError) as exc:
            failed = exc
            break
        futures.append(pending_ack)
    results: list[PublishResult] = []
    if futures:
        _done, pending = await asyncio.wait(futures, timeout=timeout_s)
        for future in pending:
            future.cancel()
        for message, future in zip(messages, futures, strict=False):
            results.append(_ack_of(message, future))
    if failed is not None:
        results += [failed] * (len(messages) - len(results))
    return results


def _ack_of(message: OutgoingMessage, future: asyncio.Future[PubAck]) -> PublishResult:
    if future.cancelled():
        return NatsPublishFailed(f"publish {message.msg_id}: no JetStream ack in time")
    exc = future.exception()
    if exc is not None:
        try:
            with translate_errors(f"publish {message.msg_id}"):
                raise exc
        except (RetryableError, PermanentError) as translated:
            return translated
    ack = future.result()
    return PublishAck(
        msg_id=message.msg_id, duplicate=bool(ack.duplicate), stream=ack.stream, seq=ack.seq
    )


@dataclass
class InMemoryPublisher:
    """A ``RequestPublisher`` for unit tests: records messages, dedupes by msg id like JetStream."""

    connected: bool = True
    #: Fail the publish of this message (0-based, counted over the fake's life).
    fail_at: int | None = None
    published: list[OutgoingMessage] = field(default_factory=list)
    _attempts: int = 0
    _seen: set[str] = field(default_factory=set)

    @property
    def is_connected(self) -> bool:
        return self.connected

    async def publish_batch(self, messages: Sequence[OutgoingMessage]) -> list[PublishResult]:
        results: list[PublishResult] = []
        for index, message in enumerate(messages):
            if not self.connected or self._attempts == self.fail_at:
                self._attempts += 1
                error = NatsPublishFailed(f"publish {message.msg_id}: injected failure")
                return results + [error] * (len(messages) - index)
            self._attempts += 1
            duplicate = message.msg_id in self._seen
            self._seen.add(message.msg_id)
            self.published.append(message)
            results.append(PublishAck(msg_id=message.msg_id, duplicate=duplicate))
        return results
