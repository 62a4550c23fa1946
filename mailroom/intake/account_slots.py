"""IMAP connections per account across every process: slots in Redis, each with a lease.

Servers cap the connections of one user (Dovecot's ``mail_max_userip_connections``, 10 by
default; Gmail 15) and refuse the next login. Watchers and polls of many processes log
in to the same accounts, so the count lives in Redis: one sorted set per account whose
members are the holders and whose scores are their expiry (Redis's own clock, one clock
for every process). A holder that dies frees its slot when its lease runs out.
"""

from __future__ import annotations

import redis.asyncio as aioredis

#: Drop expired holders; renew the caller's slot or take a free one. 1 when held, else 0.
_TAKE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('ZADD', KEYS[1], ms + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
"""

#: Where the slots of an account live, after the deployment's namespace (the broker's) and
#: before the account (``connections.account_key``'s digest).
KEY_PART = ":imap-slots:"


class AccountSlots:
    """At most ``limit`` holders per account, each for ``ttl_s`` unless renewed."""

    def __init__(self, client: aioredis.Redis, *, namespace: str, limit: int, ttl_s: float) -> None:
        self.client = client
        self.prefix = namespace + KEY_PART
        self.limit = limit
        self.ttl_ms = int(ttl_s * 1000)
        self._take = client.register_script(_TAKE)

    async def take(self, account: str, holder: str, *, limit: int | None = None) -> bool:
        """Hold a slot of ``account`` (or renew the one held); False when all are taken.

        ``limit``: fewer slots than the account has, for a holder that leaves room to others.
        """
        cap = self.limit if limit is None else min(limit, self.limit)
        taken = await self._take(keys=[self.prefix + account], args=[holder, cap, self.ttl_ms])
        return bool(taken)

    async def give_back(self, account: str, holder: str) -> None:
        await self.client.zrem(self.prefix + account, holder)

    async def held(self, account: str) -> int:
        """Slots held now, expired ones left out."""
        key = self.prefix + account
        now_s, now_us = await self.client.time()
        return int(await self.client.zcount(key, now_s * 1000 + now_us // 1000, "+inf"))
