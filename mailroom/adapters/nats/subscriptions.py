"""Result subscriptions for the bridge: a durable JetStream pull consumer or a core queue group.

Both give ``IncomingMessage`` batches through ``fetch``, so the bridge never
knows which one it reads; on core NATS ``ack`` and ``nak`` do nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import nats.errors
from nats.aio.client import Client as NatsConnection
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from mailroom.adapters.nats.translate import translate_errors
from mailroom.errors import NatsPublishFailed
from mailroom.service.wire import flushed
from mailroom.settings import NatsSettings


@dataclass
class IncomingMessage:
    """A message for the bridge; ``ack`` confirms it (a no-op on core NATS)."""

    subject: str
    data: bytes
    headers: dict[str, str]
    ack: Callable[[], Awaitable[None]]
    nak: Callable[[], Awaitable[None]]
    #: The subject the sender asked replies on (a plain subscription only; empty if none).
    reply: str = ""


class ResultSubscription(Protocol):
    async def fetch(self, batch: int, timeout_s: float) -> list[IncomingMessage]: ...

    async def close(self) -> None: ...


def inbox_consumer_config(settings: NatsSettings) -> ConsumerConfig:
    """The inbox's durable pull consumer: every answer on the results subject, acked one by one."""
    s = settings
    return ConsumerConfig(
        durable_name=s.inbox_durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=s.bridge_ack_wait_s,
        filter_subject=s.subject(s.results_subject),
    )


async def subscribe_pull(js: JetStreamContext, settings: NatsSettings) -> ResultSubscription:
    """The durable pull consumer of the results subject, created or bound."""
    s = settings
    subject = s.subject(s.results_subject)
    config = inbox_consumer_config(s)
    with translate_errors(f"consumer {s.inbox_durable}"):
        if not s.manage_stream:
            # The operator owns the consumer (ensure_stream checked it exists): bind only.
            sub = await js.pull_subscribe_bind(s.inbox_durable, stream=s.stream_name)
        else:
            # Binds to an existing consumer as it is; creates it only when missing.
            sub = await js.pull_subscribe(
                subject, durable=s.inbox_durable, stream=s.stream_name, config=config
            )
    return _PullSubscription(sub)


async def subscribe_core(nc: NatsConnection, settings: NatsSettings) -> ResultSubscription:
    """A core queue-group subscription of the results subject, confirmed by the server."""
    s = settings
    subject = s.subject(s.results_subject)
    core = _CoreSubscription(buffer=s.bridge_fetch_batch)
    with translate_errors(f"subscribe {subject}"):
        # Past these limits nats-py drops results (slow consumer, logged by the client's
        # error callback) rather than grow without bound: core NATS is at most once anyway,
        # and the outbox (no ack) or the watchdog (no result) settles a job whose answer is lost.
        core.sub = await nc.subscribe(
            subject,
            queue=s.inbox_queue_group,
            cb=core.on_message,
            pending_msgs_limit=s.core_pending_msgs_limit,
            pending_bytes_limit=s.core_pending_bytes_limit,
        )
        # Core NATS drops what is published before the server has the SUB, so
        # "subscribed" means the server answered a PING sent after it.
        await flushed(nc, s.publish_timeout_s)
    return core


async def subscribe_every(nc: NatsConnection, subject: str, *, buffer: int) -> ResultSubscription:
    """A plain subscription (no queue group) that sees every message on ``subject``.

    For tools that watch a subject beside the consumers that own it (the conformance check).
    """
    core = _CoreSubscription(buffer=buffer)
    with translate_errors(f"subscribe {subject}"):
        core.sub = await nc.subscribe(subject, cb=core.on_message)
        await flushed(nc)
    return core


async def _noop() -> None:
    return None


def _headers(msg: Msg) -> dict[str, str]:
    return dict(msg.headers or {})


class _PullSubscription:
    def __init__(self, sub: JetStreamContext.PullSubscription) -> None:
        self._sub = sub

    async def fetch(self, batch: int, timeout_s: float) -> list[IncomingMessage]:
        try:
            with translate_errors("fetch"):
                msgs = await self._sub.fetch(batch, timeout=timeout_s)
        except NatsPublishFailed as exc:
            if isinstance(exc.__cause__, TimeoutError):
                return []  # nothing arrived within the wait
            raise
        return [
            IncomingMessage(
                subject=m.subject, data=m.data, headers=_headers(m), ack=m.ack, nak=m.nak
            )
            for m in msgs
        ]

    async def close(self) -> None:
        with contextlib.suppress(nats.errors.Error), translate_errors("unsubscribe"):
            await self._sub.unsubscribe()


class _CoreSubscription:
    """Queue-group subscription; a local queue turns pushed messages into fetches."""

    def __init__(self, *, buffer: int) -> None:
        self.sub: Subscription | None = None
        # NOTE: bounded, so a slow bridge makes ``on_message`` wait and the backlog stays
        # in nats-py's pending queue, where the subscription's pending limits apply.
        self._queue: asyncio.Queue[Msg] = asyncio.Queue(maxsize=max(1, buffer))

    async def on_message(self, msg: Msg) -> None:
        await self._queue.put(msg)

    async def fetch(self, batch: int, timeout_s: float) -> list[IncomingMessage]:
        try:
            first = await asyncio.wait_for(self._queue.get(), timeout_s)
        except TimeoutError:
            return []
        msgs = [first]
        while len(msgs) < batch and not self._queue.empty():
            msgs.append(self._queue.get_nowait())
        return [
            IncomingMessage(
                subject=m.subject,
                data=m.data,
                headers=_headers(m),
                ack=_noop,
                nak=_noop,
                reply=m.reply,
            )
            for m in msgs
        ]

    async def close(self) -> None:
        if self.sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self.sub.unsubscribe()
