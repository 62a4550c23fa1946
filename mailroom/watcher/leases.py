"""Which watcher process watches which account: leases in Redis, shared out evenly.

Each watcher renews its membership and its accounts' leases every third of a lease; the
accounts are shared by the live members (a fair share each, rounded up), so a second
watcher takes half of them as the first gives back what is over its share, and a
watcher that dies leaves leases that run out: the others take its accounts within a lease.
Redis's own clock decides expiry, one clock for every process.
"""

from __future__ import annotations

import math
import zlib

import redis.asyncio as aioredis

#: The keys, after the deployment's namespace (the broker's): the live watchers, and each
#: account's lease.
MEMBERS_PART = ":imap-watchers"
LEASE_PART = ":imap-watch:"

#: Take the account's lease if it is free or already ours; 1 when ours.
_TAKE = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

#: Give the lease back only if it is ours.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

#: Renew our membership, drop members whose lease ran out; how many are live.
_MEMBERS = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
return redis.call('ZCARD', KEYS[1])
"""


class AccountLeases:
    """This watcher's (``holder``) leases on accounts, each ``lease_s`` long unless renewed."""

    def __init__(
        self, client: aioredis.Redis, *, namespace: str, holder: str, lease_s: float
    ) -> None:
        self.client = client
        self.members_key = namespace + MEMBERS_PART
        self.lease_prefix = namespace + LEASE_PART
        self.holder = holder
        self.lease_ms = int(lease_s * 1000)
        self.held: set[str] = set()
        self._take = client.register_script(_TAKE)
        self._release = client.register_script(_RELEASE)
        self._members = client.register_script(_MEMBERS)

    async def rebalance(self, accounts: list[str]) -> set[str]:
        """Renew what we hold, take free accounts up to our share, give back what is over it.

        Returns the accounts held now. Accounts no longer configured are given back.
        """
        members = int(
            await self._members(keys=[self.members_key], args=[self.holder, self.lease_ms])
        )
        share = math.ceil(len(accounts) / max(members, 1))
        wanted = set(accounts)
        held: set[str] = set()
        for account in sorted(self.held):
            if account in wanted and len(held) < share and await self._take_one(account):
                held.add(account)
            else:
                await self._release_one(account)
        # Start at a place of our own in the list, so watchers starting together rarely race
        # for the same accounts.
        if accounts and len(held) < share:
            start = zlib.crc32(self.holder.encode()) % len(accounts)
            for account in accounts[start:] + accounts[:start]:
                if len(held) >= share:
                    break
                if account not in held and await self._take_one(account):
                    held.add(account)
        self.held = held
        return held

    async def _take_one(self, account: str) -> bool:
        return bool(
            await self._take(keys=[self.lease_prefix + account], args=[self.holder, self.lease_ms])
        )

    async def _release_one(self, account: str) -> None:
        await self._release(keys=[self.lease_prefix + account], args=[self.holder])

    async def release_all(self) -> None:
        """Give every lease and the membership back (a clean stop: others take over at once)."""
        for account in self.held:
            await self._release_one(account)
        self.held = set()
        await self.client.zrem(self.members_key, self.holder)
