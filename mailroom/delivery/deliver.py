"""Delivering channel messages, one or a batch at a time (ARCHITECTURE.md, Deliver).

1. Settled already (Redis delivered-key, or a final status in Postgres) → done.
2. Processing lock ``SET NX PX`` (owner ``{host-pid, started_at}``), renewed every
   TTL/3 until settled; a failed renewal abandons the send.
3. ``attempts + 1`` committed before sending; past the maximum → failure.
4. Send the unsent chunks through the channel's middleware chain, recording each.
5. Settle: delivered, failed / partial_failed, or pending again with ``next_retry_at``
   (``DeliveryDeferred`` tells Dramatiq when to retry).

Every write after the claim is fenced on ``attempts``: an attempt whose lock
lapsed and was taken over changes nothing.

A batch runs each message through exactly these steps, up to ``batch_concurrency``
at a time, sharing the round trips with every batch on its event loop: locks, claims
and successful settlements that are ready at the same moment go out as one call or
statement (``mailroom.delivery.batch``), and a batch's locks are renewed together. A message's
failure is its own: it ends in that message's outcome (or its retry), never in
its neighbours'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from mailroom.adapters.redis import DeliveryRedis, describe_holder
from mailroom.backoff import backoff
from mailroom.db.engine import transaction
from mailroom.delivery import metrics
from mailroom.delivery.batch import Batch, Claim, Found, Lane, Rounds
from mailroom.delivery.chunks import FAILED, SENT, ChunkPlan
from mailroom.delivery.locks import BatchLease, LockOwner, process_owner
from mailroom.delivery.outcomes import (
    BatchResult,
    Outcome,
    describe_error,
    log_batch,
    truncate_error,
    unclaimed,
)
from mailroom.delivery.ports import Envelope, Outbound, Send
from mailroom.delivery.statements import (
    RETRY_IN_S,
    UNCERTAIN_ERROR,
    fenced_update,
    stale_recovered_event,
)
from mailroom.errors import DeliveryDeferred, LeaseLost, PermanentError, RateLimited, RetryableError
from mailroom.settings import DeliverySettings

logger = logging.getLogger(__name__)


@dataclass
class Deliverer:
    """Delivers channel messages; collaborators are injected, nothing global."""

    sessions: async_sessionmaker[AsyncSession]
    redis: DeliveryRedis
    outbound: Outbound
    settings: DeliverySettings
    owner: LockOwner = field(default_factory=process_owner)
    rng: random.Random = field(default_factory=random.Random)
    #: Reloads the channel accounts if their rows changed, once per batch (None: fixed).
    refresh_accounts: Callable[[], Awaitable[None]] | None = None
    _shared: Rounds | None = field(default=None, init=False, repr=False)

    async def deliver(self, message_id: int) -> Outcome:
        """Deliver ``message_id``; raises ``DeliveryDeferred`` when it should run again later.

        Any other error that stopped the attempt (Redis or Postgres down) is raised as well.
        """
        result = await self.deliver_many([message_id])
        error = result.retries.get(message_id)
        if error is not None:
            raise error
        return result.outcomes[message_id]

    async def deliver_many(self, message_ids: Sequence[int]) -> BatchResult:
        """Deliver each of ``message_ids`` (duplicates once); one outcome or retry per id.

        Raises only when nothing could start (no database connection): then no
        message was locked or claimed and the whole batch may simply run again.
        """
        result = BatchResult()
        mine: list[int] = []
        for message_id in dict.fromkeys(int(mid) for mid in message_ids):
            if self.owner.enter(message_id):
                mine.append(message_id)
            else:
                logger.debug("Message %s is being delivered by this process already", message_id)
                result.outcomes[message_id] = Outcome.HELD
        try:
            if mine:
                await self._deliver_many(mine, result)
        finally:
            for message_id in mine:
                self.owner.leave(message_id)
        log_batch(result)
        return result

    async def _deliver_many(self, message_ids: list[int], result: BatchResult) -> None:
        if self.refresh_accounts is not None:
            # Before any lock or claim: a failure here leaves the whole batch to run again.
            await self.refresh_accounts()
        token, ttl_ms = self.owner.token, self.settings.lock_ttl_ms

        async def renew(ids: list[int]) -> set[int]:
            return await self.redis.extend_locks(ids, token=token, ttl_ms=ttl_ms)

        # Pooled connections in autocommit: no transaction stays open while sending, and
        # single statements need no BEGIN/COMMIT round trips.
        async with contextlib.AsyncExitStack() as stack:
            rounds = self._rounds()
            await stack.enter_async_context(rounds.active())
            lease = await stack.enter_async_context(BatchLease(renew, interval_s=ttl_ms / 3000))
            batch = Batch(rounds, lease, message_ids)
            stack.push_async_callback(batch.aclose)

            async def deliver_next() -> None:
                # Each message is taken by one lane, and is locked and claimed only when its
                # turn comes (a crash strands no others): with the settlement of the lane's
                # message before it.
                lane = Lane(batch)
                while (taken := await lane.take()) is not None:
                    message_id, found = taken
                    try:
                        result.outcomes[message_id] = await self._deliver_one(
                            lane, message_id, found
                        )
                    except Exception as exc:  # this message's own retry; its neighbours go on
                        result.outcomes[message_id] = Outcome.DEFERRED
                        result.retries[message_id] = exc

            lanes = min(len(message_ids), max(1, self.settings.batch_concurrency))
            await asyncio.gather(*(deliver_next() for _ in range(lanes)))

    async def _deliver_one(self, lane: Lane, message_id: int, found: Found) -> Outcome:
        if isinstance(found, Exception):  # no lock was asked for, or its answer is unknown
            raise found
        lock, claim = found
        if lock.state == "delivered":
            return Outcome.SETTLED
        if not lock.ours:
            logger.info(
                "Message %s is locked by %s; leaving it", message_id, describe_holder(lock.holder)
            )
            return Outcome.HELD
        if isinstance(claim, Exception):
            # Nothing was sent: let the next attempt in at once. A failing release must not
            # replace the error that got us here.
            await self._release_quietly(lane.lease, message_id)
            raise claim
        if not isinstance(claim, Claim):
            await self._release(lane.lease, message_id)
            return unclaimed(message_id, claim)
        return await self._attempt(claim)

    async def _attempt(self, claim: Claim) -> Outcome:
        # A stored plan keeps the size it was cut with.
        plan = ChunkPlan.load(claim.body, claim.chunks, default_size=self.settings.chunk_size)
        try:
            if claim.attempts > self.settings.max_attempts:
                error = f"gave up after {self.settings.max_attempts} attempts"
                if claim.last_error:
                    error += f"; last error: {claim.last_error}"
                return await self._fail(claim, plan, error, reason="max_attempts")
            if claim.previous_status == "sending" and not self.outbound.is_idempotent(
                claim.channel
            ):
                # An earlier attempt died mid-send: the provider may have the chunk already.
                return await self._uncertain(claim, plan)
            return await self._send(claim, plan)
        except LeaseLost as exc:
            metrics.FAILED.labels(claim.channel, claim.account, "lease_lost").inc()
            logger.warning("Delivery of message %s abandoned: %s", claim.id, exc)
            return Outcome.LEASE_LOST

    async def _send(self, claim: Claim, plan: ChunkPlan) -> Outcome:
        try:
            send = self.outbound.sender(claim.channel, claim.account)
            await claim.lane.lease.guard(claim.id, self._send_chunks(claim, plan, send))
        except LeaseLost:
            raise
        except RateLimited as exc:
            return await self._defer(claim, plan, exc)
        except PermanentError as exc:
            return await self._fail(claim, plan, describe_error(exc), reason="permanent")
        except RetryableError as exc:
            return await self._retry(claim, plan, exc)
        except Exception as exc:  # a bug in a channel: retried, bounded by max_attempts
            logger.exception("Channel %r crashed on message %s", claim.channel, claim.id)
            return await self._retry(claim, plan, exc)
        return await self._succeed(claim, plan)

    async def _send_chunks(self, claim: Claim, plan: ChunkPlan, send: Send) -> None:
        pending = plan.unsent()
        for number in pending:
            envelope = Envelope(
                message_id=claim.id,
                channel=claim.channel,
                account=claim.account,
                recipient=claim.recipient,
                subject=claim.subject,
                body=plan.texts[number - 1],
                chunk=number,
                chunks=plan.total,
            )
            started = time.perf_counter()
            try:
                provider_id = await send(envelope)
            except Exception:
                plan.mark(number, FAILED)
                raise
            finally:
                metrics.send_seconds(claim.channel, claim.account).observe(
                    time.perf_counter() - started
                )
            plan.mark(number, SENT, provider_id)
            if number != pending[-1]:
                # Recorded at once so a retry resumes after it; the last one lands with the status.
                await self._update(claim, chunks=plan.record())

    async def _succeed(self, claim: Claim, plan: ChunkPlan) -> Outcome:
        # Settled in one round with the turns of the other lanes ready now, this lane's next
        # message taken in it (Postgres first, then the delivered key).
        if not await claim.lane.succeed(claim, plan.record()):
            raise LeaseLost(f"message {claim.id} was taken over by a later attempt")
        metrics.delivered(claim.channel, claim.account).inc()
        logger.debug(
            "Delivered message %s via %s/%s (%d chunk(s), attempt %d)",
            claim.id,
            claim.channel,
            claim.account,
            plan.total,
            claim.attempts,
        )
        return Outcome.DELIVERED

    async def _fail(self, claim: Claim, plan: ChunkPlan, error: str, *, reason: str) -> Outcome:
        status = "partial_failed" if plan.sent_count else "failed"
        await self._update(
            claim,
            status=status,
            chunks=plan.record(),
            last_error=truncate_error(error),
            next_retry_at=None,
        )
        await self._cache_final(claim, status)
        metrics.FAILED.labels(claim.channel, claim.account, reason).inc()
        logger.warning(
            "Message %s %s (%d of %d chunks sent, attempt %d): %s",
            claim.id,
            status,
            plan.sent_count,
            plan.total,
            claim.attempts,
            truncate_error(error, 200),
        )
        return Outcome.PARTIAL_FAILED if plan.sent_count else Outcome.FAILED

    async def _uncertain(self, claim: Claim, plan: ChunkPlan) -> Outcome:
        values = {"status": "uncertain", "last_error": UNCERTAIN_ERROR, "next_retry_at": None}
        async with transaction(self.sessions) as session:
            result = await session.execute(
                fenced_update(frozenset(values)),
                {**values, "fence_id": claim.id, "fence_attempts": claim.attempts},
            )
            if result.one_or_none() is None:
                raise LeaseLost(f"message {claim.id} was taken over")
            session.add(stale_recovered_event([claim.id], found_by="delivery"))
        await self._cache_final(claim, "uncertain")
        metrics.STALE_RECOVERED.labels("uncertain").inc()
        logger.warning(
            "Message %s was left mid-send by an earlier attempt; marked uncertain (%d of %d chunks "
            "recorded)",
            claim.id,
            plan.sent_count,
            plan.total,
        )
        return Outcome.UNCERTAIN

    async def _retry(self, claim: Claim, plan: ChunkPlan, exc: BaseException) -> Outcome:
        if claim.attempts >= self.settings.max_attempts:
            error = f"gave up after {claim.attempts} attempts; last error: {describe_error(exc)}"
            return await self._fail(claim, plan, error, reason="max_attempts")
        delay_s = backoff(
            claim.attempts,
            base=self.settings.backoff_base_s,
            cap=self.settings.backoff_cap_s,
            jitter=0.5,
            rng=self.rng,
        )
        metrics.FAILED.labels(claim.channel, claim.account, "retryable").inc()
        return await self._reschedule(claim, plan, exc, delay_s=delay_s, refund=False)

    async def _defer(self, claim: Claim, plan: ChunkPlan, exc: RateLimited) -> Outcome:
        # Our own throttle refunds the attempt: nothing reached the provider.
        refund = not getattr(exc, "counts_as_attempt", True)
        if not refund and claim.attempts >= self.settings.max_attempts:
            error = f"gave up after {claim.attempts} attempts; last error: {describe_error(exc)}"
            return await self._fail(claim, plan, error, reason="max_attempts")
        metrics.FAILED.labels(claim.channel, claim.account, "rate_limited").inc()
        return await self._reschedule(claim, plan, exc, delay_s=exc.retry_after_s, refund=refund)

    async def _reschedule(
        self, claim: Claim, plan: ChunkPlan, exc: BaseException, *, delay_s: float, refund: bool
    ) -> Outcome:
        values: dict[str, Any] = {
            "status": "pending",
            RETRY_IN_S: float(delay_s),  # next_retry_at, by the database's clock
            "last_error": truncate_error(describe_error(exc)),
            "chunks": plan.record(),
        }
        if refund:
            values["attempts"] = claim.attempts - 1
        await self._update(claim, **values)
        await self._release(claim.lane.lease, claim.id)
        delay_ms = max(0, int(delay_s * 1000))
        logger.info(
            "Message %s retries in %d ms (attempt %d, %d of %d chunks sent): %s",
            claim.id,
            delay_ms,
            claim.attempts,
            plan.sent_count,
            plan.total,
            truncate_error(describe_error(exc), 200),
        )
        raise DeliveryDeferred(
            f"message {claim.id} retries in {delay_ms} ms", retry_after_ms=delay_ms
        ) from exc

    async def _update(self, claim: Claim, **values: Any) -> None:
        statement = fenced_update(frozenset(values))
        result = await claim.lane.execute(
            statement, {**values, "fence_id": claim.id, "fence_attempts": claim.attempts}
        )
        if result.one_or_none() is None:
            raise LeaseLost(f"message {claim.id} was taken over by a later attempt")

    def _rounds(self) -> Rounds:
        """The round trips shared by this deliverer's batches on the running loop."""
        rounds = self._shared
        if rounds is None or rounds.loop is not asyncio.get_running_loop():
            engine = self.sessions.kw["bind"]
            assert isinstance(engine, AsyncEngine)
            rounds = self._shared = Rounds(
                engine.execution_options(isolation_level="AUTOCOMMIT"),
                redis=self.redis,
                token=self.owner.token,
                ttl_ms=self.settings.lock_ttl_ms,
                delivered_ttl_s=self.settings.delivered_ttl_s,
            )
        return rounds

    async def _release(self, lease: BatchLease, message_id: int, *, value: str = "") -> None:
        """Release our lock; with ``value``, set the delivered key first (never retried)."""
        lease.release(message_id)
        await self.redis.settle(
            message_id,
            token=self.owner.token,
            delivered=value,
            delivered_ttl_s=self.settings.delivered_ttl_s,
        )

    async def _cache_final(self, claim: Claim, status: str) -> None:
        """After Postgres recorded a final status: its delivered key, and our lock released.

        Redis is a cache of that record here: when it fails, the lock expires on its own
        and the next attempt finds the final status in Postgres.
        """
        try:
            await self._release(claim.lane.lease, claim.id, value=status)
        except Exception as exc:
            logger.warning(
                "Message %s is %s in Postgres, but its Redis keys were not written (%s)",
                claim.id,
                status,
                type(exc).__name__,
            )

    async def _release_quietly(self, lease: BatchLease, message_id: int) -> None:
        """Release our lock on the way out of an error, which a failing release must not replace."""
        try:
            await self._release(lease, message_id)
        except Exception:
            logger.warning("Releasing the lock of message %s failed", message_id)
