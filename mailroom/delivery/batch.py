"""The round trips deliveries share: group commits across every batch of an event loop.

Each message of a batch runs the whole per-message protocol in a lane, one message after
another; what the lanes of all the batches running on one event loop (one worker process)
have ready at the same moment goes out together (``Rounds``). A lane's turn settles the
message it has delivered and takes the next one: the locks of those taken as one Redis call,
then one statement that settles the deliveries (fenced on their attempts) and claims the
messages whose locks are ours (``UPDATE … WHERE id = ANY(…)``), one transaction and one
commit to wait for, then, beside the lanes (which go on at once), the delivered keys and
lock releases as one Redis call (Postgres first: the keys are only a cache of it). A worker
runs its threads' batches side by side on one loop, so sharing the round trips between them
makes each one carry several batches' messages instead of a few of one batch's. A round's
error reaches the messages in that round only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psycopg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from mailroom.adapters.redis import AcquireResult, DeliveryRedis
from mailroom.db.engine import driver_connection
from mailroom.delivery.coalesce import Coalescer
from mailroom.delivery.locks import BatchLease
from mailroom.delivery.statements import CLAIM, STATUSES, SUCCEED, SUCCEED_AND_CLAIM

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
    #: The lane the attempt runs in (its batch's connection and lease, its next message).
    lane: Lane = field(repr=False)


#: A claimed row: CLAIM's columns in order, which are Claim's fields before its lane.
ClaimRow = tuple[int, str, str, str, str | None, str, int, dict[str, Any] | None, str | None, str]


class _Taken(NamedTuple):
    """A round's answer for one message taken."""

    lock: AcquireResult
    #: ``time.monotonic()`` before the lock was asked for: it lives at least its TTL from then.
    at: float
    #: With the lock ours: the claimed row, why there is none (the message's status, or None
    #: when it does not exist), or the error that stopped the claim. Else None.
    claim: ClaimRow | str | Exception | None


@dataclass(eq=False)
class _Success:
    id: int
    attempts: int
    chunks: dict[str, Any]


@dataclass(eq=False)  # hashed by identity: a key of the group commit
class _Turn:
    """A lane's turn: the message it delivered to settle, the next one to take (either may be None)."""

    success: _Success | None
    take: int | None


class _Answer(NamedTuple):
    """A round's answer for one turn."""

    #: Whether the success was settled (False: a later attempt took it over), or the error
    #: that stopped the settlement; None without a success.
    settled: bool | Exception | None
    #: The message taken, or the error that stopped its lock; None without one.
    taken: _Taken | Exception | None


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
        self._turns: Coalescer[_Turn, _Answer] = Coalescer(self._run_turns)
        #: The delivered keys being written (``_cache`` never raises).
        self._caching: set[asyncio.Task[None]] = set()
        self._connection: AsyncConnection | None = None
        self._driver: psycopg.AsyncConnection[Any] | None = None
        self._connection_lock = asyncio.Lock()
        self._users = 0

    @contextlib.asynccontextmanager
    async def active(self) -> AsyncIterator[None]:
        """Around a batch: when the last batch is done, its delivered keys are written (they
        go on beside the lanes) and the connection is given back."""
        self._users += 1
        try:
            yield
        finally:
            self._users -= 1
            if self._users == 0:
                while self._caching:
                    await asyncio.gather(*self._caching)
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
                    opened = await driver_connection(connection)
                except BaseException:
                    await connection.close()
                    raise
                self._connection, self._driver = connection, opened
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

    async def turn(self, success: _Success | None, take: int | None) -> _Answer:
        return await self._turns.submit(_Turn(success, take))

    async def _run_turns(self, turns: Sequence[_Turn]) -> dict[_Turn, _Answer]:
        # One round for all: the locks, then at once one statement for the settlements and
        # the claims of the locks taken (not a turn of the loop and a wake-up of each lane
        # later), then the delivered keys.
        successes = [turn.success for turn in turns if turn.success is not None]
        takes = [turn.take for turn in turns if turn.take is not None]
        at = time.monotonic()
        locks: dict[int, AcquireResult] | Exception = {}
        if takes:
            try:
                locks = await self.redis.acquire_locks(takes, token=self.token, ttl_ms=self.ttl_ms)
            except Exception as exc:  # each of these messages is retried; nothing was claimed
                locks = exc
        ours = [] if isinstance(locks, Exception) else [m for m in takes if locks[m].ours]
        settled: set[int] | Exception = set()
        claims: dict[int, ClaimRow | str | Exception | None] = {}
        if successes or ours:
            try:
                settled, found = await self._write(successes, ours)
                claims.update(found)
            except Exception as exc:  # each lane releases its lock and raises it
                settled = exc
                claims = dict.fromkeys(ours, exc)
        if successes and not isinstance(settled, Exception):
            # The lanes go on at once: the keys are a cache, written while they send.
            task = asyncio.ensure_future(self._cache(successes, settled))
            self._caching.add(task)
            task.add_done_callback(self._caching.discard)
        answers: dict[_Turn, _Answer] = {}
        for turn in turns:
            was_settled: bool | Exception | None = None
            if turn.success is not None:
                was_settled = (
                    settled if isinstance(settled, Exception) else (turn.success.id in settled)
                )
            taken: _Taken | Exception | None = None
            if turn.take is not None:
                taken = (
                    locks
                    if isinstance(locks, Exception)
                    else _Taken(locks[turn.take], at, claims.get(turn.take))
                )
            answers[turn] = _Answer(was_settled, taken)
        return answers

    async def _write(
        self, successes: Sequence[_Success], message_ids: Sequence[int]
    ) -> tuple[set[int], dict[int, ClaimRow | str | None]]:
        """Settle ``successes`` and claim ``message_ids`` in one statement; returns the ids
        settled and, for each id, its claim row or status (None: no such message)."""
        params: dict[str, Any] = {}
        if successes:
            # Postgres first: it is the record of the send.
            params["rows"] = json.dumps(
                [{"id": s.id, "attempts": s.attempts, "chunks": s.chunks} for s in successes]
            )
        if message_ids:
            params |= {"ids": list(message_ids), "due_slack_s": DUE_SLACK_S}
        settled: set[int] = set()
        found: dict[int, ClaimRow | str | None] = {}
        if successes and message_ids:
            for row in await self._execute(SUCCEED_AND_CLAIM, params):
                if row[0]:
                    found[row[1]] = row[1:]
                else:
                    settled.add(row[1])
        elif successes:
            settled = {row[0] for row in await self._execute(SUCCEED, params)}
        else:
            found = {row[0]: row for row in await self._execute(CLAIM, params)}
        rest = [mid for mid in message_ids if mid not in found]
        if rest:
            rows = await self._execute(STATUSES, {"ids": rest})
            statuses = {message_id: status for message_id, status in rows}
            found.update({mid: statuses.get(mid) for mid in rest})
        return settled, found

    async def _cache(self, successes: Sequence[_Success], settled: set[int]) -> None:
        # The delivered keys and lock releases after Postgres are a cache; should Redis fail
        # now, the locks expire and a retry finds the final status in Postgres, so nothing is
        # sent twice and nothing sent ends uncertain.
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


class Batch:
    """One batch's messages, lease and own statements (a connection taken at the first one).

    Its lanes (``Lane``) take the messages in turn; locks, claims and successes go through
    the loop's shared ``Rounds``; the rarer writes of one message (a chunk recorded, a
    failure, a retry) run here, one at a time on the batch's connection.
    """

    def __init__(self, rounds: Rounds, lease: BatchLease, message_ids: Sequence[int]) -> None:
        self.rounds = rounds
        self.lease = lease
        #: The messages not taken yet: shared by the lanes, so each is taken by one lane.
        self.todo: Iterator[int] = iter(message_ids)
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

    async def aclose(self) -> None:
        await self._stack.aclose()


#: What a lane's take found: the error that stopped its lock, or the lock's state (settled,
#: ours, held by someone else) with, the lock ours, the claim or why there is none (the
#: message's status, final or not due yet; None when it does not exist; the error that
#: stopped the claim).
Found = tuple[AcquireResult, "Claim | str | Exception | None"] | Exception
#: What a lane took: the message and what its take found.
TakenMessage = tuple[int, Found]


class Lane:
    """Delivers a batch's messages one after another; each is locked and claimed only when its
    turn comes, in the round that settles the one before it (so a crash strands no other,
    and a message is settled before its lane sends the next)."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.lease = batch.lease
        self.execute = batch.execute
        self._next: TakenMessage | None = None

    async def take(self) -> TakenMessage | None:
        """The next message of the batch, locked (a lock taken is held by the lease) and,
        when the lock is ours, claimed (an attempt counted, ``sending``, committed);
        None when the batch has no more."""
        if self._next is not None:
            taken, self._next = self._next, None
            return taken
        message_id = next(self.batch.todo, None)
        if message_id is None:
            return None
        try:
            answer = await self.batch.rounds.turn(None, message_id)
        except Exception as exc:
            return message_id, exc
        return self._taken(message_id, answer.taken)

    async def succeed(self, claim: Claim, chunks: dict[str, Any]) -> bool:
        """Settle a delivered message, and take the batch's next one in the same round;
        False when a later attempt took the delivered one over."""
        # Not renewed from here on (before the lock is deleted, so a renewal racing it is no loss).
        self.lease.release(claim.id)
        message_id = next(self.batch.todo, None)
        try:
            answer = await self.batch.rounds.turn(
                _Success(claim.id, claim.attempts, chunks), message_id
            )
        except Exception as exc:
            if message_id is not None:
                self._next = message_id, exc
            raise
        if message_id is not None:
            self._next = self._taken(message_id, answer.taken)
        if isinstance(answer.settled, Exception):
            raise answer.settled
        return bool(answer.settled)

    def _taken(self, message_id: int, taken: _Taken | Exception | None) -> TakenMessage:
        if not isinstance(taken, _Taken):
            return message_id, taken or RuntimeError(f"no answer for message {message_id}")
        lock, at, found = taken
        if lock.ours:
            self.lease.hold([message_id], at=at)
        if not isinstance(found, tuple):
            return message_id, (lock, found)
        return message_id, (lock, Claim(*found, lane=self))  # CLAIM's fields in their order
