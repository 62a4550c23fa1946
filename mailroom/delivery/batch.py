"""The round trips a batch of deliveries shares: one connection, one lease, group commits.

Each message of a batch runs the whole per-message protocol in its own lane;
what the lanes have ready at the same moment goes out together: locks as one
Redis call, claims as one ``UPDATE … WHERE id = ANY(…)``, successes as one Redis
call plus one fenced ``UPDATE`` (Postgres first: the delivered keys are only a cache of it).
A flush's error reaches the messages in that flush only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from mailroom.adapters.redis import AcquireResult, DeliveryRedis
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
    chunks: dict[str, Any]
    last_error: str | None
    previous_status: str
    #: The batch the attempt belongs to (its connection and lease).
    batch: Batch = field(repr=False)


@dataclass(eq=False)  # hashed by identity: a key of the group commit
class _Success:
    id: int
    attempts: int
    chunks: dict[str, Any]


class Batch:
    """Shared by the lanes of one batch; statements run one at a time on its connection."""

    def __init__(
        self,
        connection: AsyncConnection,
        lease: BatchLease,
        *,
        redis: DeliveryRedis,
        token: str,
        ttl_ms: int,
        delivered_ttl_s: int,
    ) -> None:
        self.connection = connection
        self.lease = lease
        self.redis = redis
        self.token = token
        self.ttl_ms = ttl_ms
        self.delivered_ttl_s = delivered_ttl_s
        self._statement_lock = asyncio.Lock()
        self._locks: Coalescer[int, AcquireResult] = Coalescer(self._lock_many)
        self._claims: Coalescer[int, Claim | str | None] = Coalescer(self._claim_many)
        self._successes: Coalescer[_Success, bool] = Coalescer(self._succeed_many)

    async def execute(self, statement: Any, params: dict[str, Any]) -> Any:
        async with self._statement_lock:
            return await self.connection.execute(statement, params)

    async def lock(self, message_id: int) -> AcquireResult:
        """Take the message's processing lock (or learn it is settled or held)."""
        return await self._locks.submit(message_id)

    async def claim(self, message_id: int) -> Claim | str | None:
        """Count an attempt of the message and mark it sending (committed at once).

        Returns the claim, or why there is none: the message's status (final, or
        not due yet), or None when the message does not exist.
        """
        return await self._claims.submit(message_id)

    async def succeed(self, claim: Claim, chunks: dict[str, Any]) -> bool:
        """Settle a delivered message; False when a later attempt took it over."""
        return await self._successes.submit(_Success(claim.id, claim.attempts, chunks))

    async def aclose(self) -> None:
        await self._locks.aclose()
        await self._claims.aclose()
        await self._successes.aclose()

    async def _lock_many(self, message_ids: Sequence[int]) -> dict[int, AcquireResult]:
        return await self.redis.acquire_locks(message_ids, token=self.token, ttl_ms=self.ttl_ms)

    async def _claim_many(self, message_ids: Sequence[int]) -> dict[int, Claim | str | None]:
        params = {"ids": list(message_ids), "due_slack_s": DUE_SLACK_S}
        rows = (await self.execute(CLAIM, params)).all()
        found: dict[int, Claim | str | None] = {
            row.id: Claim(**row._asdict(), batch=self) for row in rows
        }
        rest = [mid for mid in message_ids if mid not in found]
        if rest:
            statuses = dict((await self.execute(STATUSES, {"ids": rest})).all())
            found.update({mid: statuses.get(mid) for mid in rest})
        return found

    async def _succeed_many(self, successes: Sequence[_Success]) -> dict[_Success, bool]:
        for success in successes:
            self.lease.release(success.id)
        # Postgres first: it is the record of the send. The delivered keys and lock releases
        # after it are a cache; should Redis fail now, the locks expire and a retry finds the
        # final status in Postgres, so nothing is sent twice and nothing sent ends uncertain.
        rows = json.dumps(
            [{"id": s.id, "attempts": s.attempts, "chunks": s.chunks} for s in successes]
        )
        settled = set((await self.execute(SUCCEED, {"rows": rows})).scalars())
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
