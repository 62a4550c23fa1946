"""How a service publishes an answer: acknowledged by JetStream where a stream captures the
answers subject, else core NATS.

A core publish is at most once: its flush proves only that the server read it, and while the
stream's leader is being elected the server drops what it cannot store, with no error to
anyone (on a three-server cluster, 13,300 of 20,000 answers published that way around a
killed leader never reached the stream). A lost ack heals (Mailroom publishes the request
again), a lost result ends its job as ``timeout``. So where a stream captures the subject,
each answer goes out with ``js.publish`` and counts as sent once the stream acknowledged it
(PubAck); a publish that timed out or found no leader is tried again under the same
``Nats-Msg-Id``, which the stream's duplicate window dedupes, until ``PUBLISH_BUDGET_S`` has
passed. Where no stream captures it (Mailroom on core NATS), answers are published and
flushed, one flush shared by the answers published in the same turn of the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsConnection

from mailroom.recognition.contract.models import MSG_ID_HEADER
from mailroom.service.wire import flushed

logger = logging.getLogger(__name__)

#: Longest an answer is published again before it is given up, in seconds: a stream leader
#: election takes a few seconds (5.8 s seen on a loaded three-server cluster).
PUBLISH_BUDGET_S = 30.0
#: Wait between two tries of one answer, in seconds.
RETRY_WAIT_S = 0.25
#: How long "no stream captures the subject" is believed before it is asked again, in seconds.
LOOKUP_EVERY_S = 5.0
#: What a publish meets while the stream has no leader or the client reconnects.
UNCONFIRMED = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)


class AnswerPublisher:
    """Publishes answers on ``subject``; ``captured`` once a stream was found to capture it."""

    def __init__(
        self, nc: NatsConnection, subject: str, *, timeout_s: float, jetstream: bool = True
    ) -> None:
        self.nc = nc
        self.subject = subject
        self.timeout_s = timeout_s
        self.js = nc.jetstream(timeout=timeout_s)
        #: False: Mailroom runs on core NATS, no stream is looked for.
        self.jetstream = jetstream
        self.captured = False
        self._looked_at = float("-inf")
        self._lookup = asyncio.Lock()
        #: The flush the core publishes since it was begun wait for (see ``flush``).
        self._next_flush: asyncio.Future[None] | None = None

    async def publish(self, data: bytes, msg_id: str) -> None:
        """Publish one answer and return once it is confirmed (PubAck, or a flush on core)."""
        await self.publish_unconfirmed(data, msg_id)
        await self.flush()

    async def publish_unconfirmed(self, data: bytes, msg_id: str) -> None:
        """``publish`` without the core flush (``flush`` confirms several at once)."""
        headers = {MSG_ID_HEADER: msg_id}
        if not self.captured:
            # One lookup at a time: answers published while it runs wait for its outcome
            # instead of going out with core NATS into a stream that captures them.
            async with self._lookup:
                captured = self.captured or await self._stream_captures()
            if captured is False:
                await self.nc.publish(self.subject, data, headers=headers)
                return
            # captured, or unknown: JetStream's confirmation is the only way to know it is kept
        deadline = time.monotonic() + PUBLISH_BUDGET_S
        while True:
            try:
                await self.js.publish(self.subject, data, timeout=self.timeout_s, headers=headers)
                return
            except UNCONFIRMED as exc:
                if time.monotonic() >= deadline:
                    raise
                logger.debug("service: %s not acknowledged (%s); again", msg_id, exc)
                await asyncio.sleep(RETRY_WAIT_S)

    async def flush(self) -> None:
        """Return once the server has every core publish made before this call.

        A flush is a PING and its PONG, after the publishes buffered before it. The answers
        published while one is due share it: the first starts it, it is begun on the loop's
        next turn, and answers published after that wait for the next one.
        """
        if self.captured:
            return  # each answer waited for the stream's acknowledgement
        if self._next_flush is None:
            self._next_flush = asyncio.ensure_future(self._flush_shared())
            # Read by whoever still waits; marked retrieved for when all of them were cancelled.
            self._next_flush.add_done_callback(_retrieved)
        await asyncio.shield(self._next_flush)

    async def _flush_shared(self) -> None:
        await asyncio.sleep(0)  # the answers published in this turn join
        self._next_flush = None  # those from now on wait for a flush begun after them
        await flushed(self.nc, self.timeout_s)

    async def _stream_captures(self) -> bool | None:
        """Whether a stream captures the subject (asked until one does: Mailroom creates it);
        None when JetStream could not say (no leader yet, a timeout on a busy server).

        An unknown answer is not "no stream": published with core NATS into a stream whose
        leader is being elected, the answer would be lost without an error.
        """
        if not self.jetstream or time.monotonic() - self._looked_at < LOOKUP_EVERY_S:
            return False
        try:
            await self.js.find_stream_name_by_subject(self.subject)
        except (nats.js.errors.NotFoundError, nats.errors.NoRespondersError):
            self._looked_at = time.monotonic()  # no stream, or no JetStream at all
            return False
        except (nats.errors.TimeoutError, nats.js.errors.APIError) as exc:
            logger.debug(
                "service: cannot tell whether a stream captures %s (%s)", self.subject, exc
            )
            return None
        self.captured = True
        logger.info("service: a stream captures %s; answers wait for its acks", self.subject)
        return True


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
