"""Coalesced actor passes: one queued pass stands for every request made before it starts.

Whoever wants a pass sets a Redis mark with ``NX`` and sends the actor only when the
mark was not set already; the pass clears the mark before it reads anything, so a
request that found the mark set is served by the pass that set it. A mark left by a
process that died before sending expires after its TTL (a sweep runs the pass anyway).
Redis errors never stop the work: a request that cannot be recorded sends a pass,
a mark that cannot be cleared expires.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassRequest:
    """The mark of one kind of pass (``what`` names it in the log lines)."""

    key: str
    ttl_s: int
    what: str

    async def request(self, redis: aioredis.Redis) -> bool:
        """Mark a pass as wanted; True when the caller must send one (none waits to start)."""
        try:
            return bool(await redis.set(self.key, "1", nx=True, ex=self.ttl_s))
        except RedisError as exc:
            logger.warning("%s request not recorded (%s); sending one", self.what, exc)
            return True

    async def started(self, redis: aioredis.Redis) -> None:
        """A pass starts: requests from now on ask for the next one."""
        try:
            await redis.delete(self.key)
        except RedisError as exc:  # the mark expires; requests until then join this pass
            logger.warning("%s request not cleared: %s", self.what, exc)
