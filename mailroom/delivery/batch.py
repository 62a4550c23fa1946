"""The round trips deliveries share: group commits across every batch of an event loop.

Each message of a batch runs the whole per-message protocol in its own lane;
what the lanes of all the batches running on one event loop (one worker process)
have ready at the same moment goes out together (``Rounds``): locks as one Redis
call followed at once by the claims of those taken as one ``UPDATE … WHERE id =
ANY(…)``, successes as one fenced ``UPDATE`` plus one Redis call (Postgres first:
the delivered keys are only a cache of it). A worker runs its threads' batches side by side on one loop, so
sharing the round trips between them makes each one carry several batches'
messages instead of a few of one batch's. A flush's error reaches the messages in
that flush only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psycopg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from mailroom.adapters.redis import AcquireResult, DeliveryRedis
from mailroom.db import driver_connection
from mailroom.delivery.coalesce import Coalescer
from mailroom.delivery.locks import BatchLease
from mailroom.delivery.statements import CLAIM, STATUSES, SUCCEED

logger = logging.getLogger(__name__)

#: A retry may arrive this early before ``next_retry_at`` and still count as due, in seconds.
DUE_SLACK_S = 1.0


@dataclass
class Claim:
    """One attempt of one message, counted and marked ``sending`` in Postgres."""

    id: int
    channel: str
    account: str
    recipient: str
    subject: str | None
    body: str
    attempts: int
    #: The chunk record (``mailroom.delivery.chunks``); None while it is empty.
    chunks: dict[str, Any] | None
    last_error: str | None
    previous_status: str
    #: The batch the attempt belongs to (its connection and lease).
    batch: Batch = field(repr=False)


class _Taken(NamedTuple):
    """A lock round's answer for one message."""

    lock: AcquireResult
    #: ``time.monotonic()`` before the lock was asked for: it lives at least its TTL from then.
    at: float
    #: With the lock ours: the claimed row, why there is none (the message's status, or None
    #: when it does not exist), or the error that stopped the claim. Else None.
    claim: tuple[Any, ...] | str | Exception | None


@dataclass(eq=False)  # hashed by identity: a key of the group commit
class _Success:
    id: int
    attempts: int
    chunks: dict[str, Any]


class Rounds:
    """The shared round trips of the batches on one event loop, for one lock owner.

    The Postgres flushes run one at a time on one pooled connection of ``engine`` (in
    autocommit), taken at the first and kept while any batch is ``active``: a checkout
    per flush cost more CPU than the flush's statement.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        redis: DeliveryRedis,
        token: str,
        ttl_ms: int,
        delivered_ttl_s: int,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.engine = engine
        self.redis = redis
        self.token = token
        self.ttl_ms = ttl_ms
        self.delivered_ttl_s = delivered_ttl_s
        self._takes: Coalescer[int, _Taken] = Coalescer(self._take_many)
        self._successes: Coalescer[_Success, bool] = Coalescer(self._succeed_many)
        self._connection: AsyncConnection | None = None
        self._driver: psycopg.AsyncConnection[Any] | None = None
        self._connection_lock = asyncio.Lock()
        self._users = 0

    @contextlib.asynccontextmanager
    async def active(self) -> AsyncIterator[None]:
        """Around a batch: the connection is given back when the last batch is done."""
        self._users += 1
        try:
            yield
        finally:
            self._users -= 1
            if self._users == 0:
                async with self._connection_lock:  # after a flush still running
                    if self._users == 0 and self._connection is not None:
                        connection, self._connection = self._connection, None
                        try:
                            await connection.close()
                        except Exception as exc:  # the batch's outcomes stand
                            logger.warning(
                                "Closing a delivery connection failed (%s)", type(exc).__name__
                            )

    async def _execute(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """One statement (psycopg's paramstyle) on the shared connection, its rows read
        as tuples (a dict per row, and a claim built from one by keyword, cost more)."""
        async with self._connection_lock:
            if self._connection is None:
                connection = await self.engine.connect()
                try:
                    driver = await driver_connection(connection)
                except BaseException:
                    await connection.close()
                    raise
                self._connection, self._driver = connection, driver
            driver = self._driver
            assert driver is not None
            try:
                async with driver.cursor() as cursor:
                    await cursor.execute(query, params)
                    return await cursor.fetchall()
            except BaseException:
                # Its state is unknown (a broken socket, a statement timeout, a cancellation
                # mid-statement): the next flush takes a fresh connection.
                connection, self._connection = self._connection, None
                with contextlib.suppress(Exception):
                    await connection.invalidate()
                    await connection.close()
                raise

    async def take(self, message_id: int) -> _Taken:
        return await self._takes.submit(message_id)

    async def succeed(self, message_id: int, attempts: int, chunks: dict[str, Any]) -> bool:
        return await self._successes.submit(_Success(message_id, attempts, chunks))

    async def _take_many(self, message_ids: Sequence[int]) -> dict[int, _Taken]:
        # One round for both: the claims follow their locks at once, not a turn of the loop
        # and a wake-up of each lane later (a Redis error reaches every message of the round).
        at = time.monotonic()
        locks = await self.redis.acquire_locks(message_ids, token=self.token, ttl_ms=self.ttl_ms)
        ours = [mid for mid in message_ids if locks[mid].ours]
        claims: dict[int, tuple[Any, ...] | str | Exception | None] = {}
        if ours:
            try:
                claims.update(await self._claim_many(ours))
            except Exception as exc:  # each lane releases its lock and raises it
                claims = dict.fromkeys(ours, exc)
        return {mid: _Taken(locks[mid], at, claims.get(mid)) for mid in message_ids}

    async def _claim_many(
        self, message_ids: Sequence[int]
    ) -> dict[int, tuple[Any, ...] | str | None]:
        params = {"ids": list(message_ids), "due_slack_s": DUE_SLACK_S}
        found: dict[int, tuple[Any, ...] | str | None] = {
            row[0]: row for row in await self._execute(CLAIM, params)
        }
        rest = [mid for mid in message_ids if mid not in found]
        if rest:
            rows = await self._execute(STATUSES, {"ids": rest})
            statuses = {message_id: status for message_id, status in rows}
            found.update({mid: statuses.get(mid) for mid in rest})
        return found

    async def _succeed_many(self, successes: Sequence[_Success]) -> dict[_Success, bool]:
        # Postgres first: it is the record of the send. The delivered keys and lock releases
        # after it are a cache; should Redis fail now, the locks expire and a retry finds the
        # final status in Postgres, so nothing is sent twice and nothing sent ends uncertain.
        rows = json.dumps(
            [{"id": s.id, "attempts": s.attempts, "chunks": s.chunks} for s in successes]
        )
        settled = {row[0] for row in await self._execute(SUCCEED, {"rows": rows})}
        try:
            await self.redis.settle_many(
                [(s.id, "delivered" if s.id in settled else "") for s in successes],
                token=self.token,
                delivered_ttl_s=self.delivered_ttl_s,
            )
        except Exception as exc:
            logger.warning(
                "Delivered messages %s are settled in Postgres, but their Redis keys were not "
                "written (%s); their locks expire on their own",
                sorted(settled),
                type(exc).__name__,
            )
        return {success: success.id in settled for success in successes}


class Batch:
    """One batch's lease and its own statements (a connection taken at the first one).

    Locks, claims and successes go through the loop's shared ``Rounds``; the rarer
    writes of one message (a chunk recorded, a failure, a retry) run here, one at a
    time on the batch's connection.
    """

    def __init__(self, rounds: Rounds, lease: BatchLease) -> None:
        self.rounds = rounds
        self.lease = lease
        self._connection: AsyncConnection | None = None
        self._statement_lock = asyncio.Lock()
        self._stack = contextlib.AsyncExitStack()

    async def execute(self, statement: Any, params: dict[str, Any]) -> Any:
        async with self._statement_lock:
            if self._connection is None:
                self._connection = await self._stack.enter_async_context(
                    self.rounds.engine.connect()
                )
            return await self._connection.execute(statement, params)

    async def take(self, message_id: int) -> tuple[AcquireResult, Claim | str | Exception | None]:
        """Take the message's processing lock and, when it is ours, claim the message: count
        an attempt and mark it sending (committed at once). A lock taken is held by the lease.

        Returns the lock's state (settled, ours, or held by someone else) and, with the lock
        ours, the claim or why there is none: the message's status (final, or not due yet),
        None when the message does not exist, or the error that stopped the claim.
        """
        lock, at, found = await self.rounds.take(message_id)
        if lock.ours:
            self.lease.hold([message_id], at=at)
        if not isinstance(found, tuple):
            return lock, found
        return lock, Claim(*found, batch=self)  # CLAIM returns the fields in their order

    async def succeed(self, claim: Claim, chunks: dict[str, Any]) -> bool:
        """Settle a delivered message; False when a later attempt took it over."""
        # Not renewed from here on (before the lock is deleted, so a renewal racing it is no loss).
        self.lease.release(claim.id)
        return await self.rounds.succeed(claim.id, claim.attempts, chunks)

    async def aclose(self) -> None:
        await self._stack.aclose()
