"""IMAP connections per account across every process: slots in Redis, each with a lease.

Servers cap the connections of one user (Dovecot's ``mail_max_userip_connections``, 10 by
default; Gmail 15) and refuse the next login. Watchers and polls of many processes log
in to the same accounts, so the count lives in Redis: one sorted set per account whose
members are the holders and whose scores are their expiry (Redis's own clock, one clock
for every process). A holder that dies frees its slot when its lease runs out.

A poll's connection may wait minutes in its process's pool for the next poll, so its slot
is not renewed by its use alone: ``SlotKeeper`` renews every slot a process holds a third
of the lease, and the lease stays short. A worker that dies (its sockets closed with it)
so frees its account's slots within one lease, not after the longest a connection is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

#: What a holder does when its slot was lost while its connection is open.
OnLost = Callable[[], Awaitable[None]]

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

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        namespace: str,
        limit: int,
        ttl_s: float,
        max_in_flight: int | None = None,
    ) -> None:
        self.client = client
        self.prefix = namespace + KEY_PART
        self.limit = limit
        self.ttl_ms = int(ttl_s * 1000)
        self._take = client.register_script(_TAKE)
        # The watcher's renewals of a thousand accounts fall due together: unbounded, each
        # call would open a connection of the client's pool (and a file descriptor) for good.
        self._in_flight: contextlib.AbstractAsyncContextManager[object] = (
            asyncio.Semaphore(max_in_flight) if max_in_flight else contextlib.nullcontext()
        )

    async def take(self, account: str, holder: str, *, limit: int | None = None) -> bool:
        """Hold a slot of ``account`` (or renew the one held); False when all are taken.

        ``limit``: fewer slots than the account has, for a holder that leaves room to others.
        """
        cap = self.limit if limit is None else min(limit, self.limit)
        async with self._in_flight:
            taken = await self._take(keys=[self.prefix + account], args=[holder, cap, self.ttl_ms])
        return bool(taken)

    async def renew(self, held: list[tuple[str, str]]) -> list[bool]:
        """``take`` for each ``(account, holder)``, in one round trip."""
        async with self.client.pipeline(transaction=False) as pipe:
            for account, holder in held:
                await self._take(
                    keys=[self.prefix + account],
                    args=[holder, self.limit, self.ttl_ms],
                    client=pipe,
                )
            return [bool(taken) for taken in await pipe.execute()]

    async def give_back(self, account: str, holder: str) -> None:
        async with self._in_flight:
            await self.client.zrem(self.prefix + account, holder)

    async def held(self, account: str) -> int:
        """Slots held now, expired ones left out."""
        key = self.prefix + account
        now_s, now_us = await self.client.time()
        return int(await self.client.zcount(key, now_s * 1000 + now_us // 1000, "+inf"))


class SlotKeeper:
    """Renews the slots this process holds, a third of their lease, while it lives."""

    def __init__(self, slots: AccountSlots) -> None:
        self.slots = slots
        self.every_s = slots.ttl_ms / 3000
        #: holder -> (account, what to do should its slot be lost), for the slots not given back.
        self._held: dict[str, tuple[str, OnLost | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def hold(self, account: str, holder: str, *, on_lost: OnLost | None = None) -> None:
        """Renew ``holder``'s slot from now on; starts the renewals on the running loop.

        ``on_lost``: awaited should a renewal find the slot gone (its lease ran out unrenewed,
        Redis away longer, and the account's slots are taken), typically to close the
        connection. Without it the loss is logged and the connection lives on, uncounted,
        until its owner closes it.
        """
        self._held[holder] = (account, on_lost)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._renew_forever())

    def release(self, holder: str) -> None:
        self._held.pop(holder, None)

    async def renew(self) -> None:
        """One renewal of every slot held, in one round trip; the slots found lost are let go."""
        held = list(self._held.items())
        if not held:
            return
        taken = await self.slots.renew([(account, holder) for holder, (account, _) in held])
        for (holder, (_account, on_lost)), ok in zip(held, taken, strict=True):
            if ok or holder not in self._held:
                continue
            del self._held[holder]  # said once
            if on_lost is not None:
                await on_lost()
            else:
                logger.warning(
                    "IMAP connection slot of %s lost while its connection is open", holder
                )

    async def _renew_forever(self) -> None:
        while self._held:
            await asyncio.sleep(self.every_s)
            try:
                await self.renew()
            except RedisError as exc:
                if not self._failing:
                    logger.warning("IMAP connection slots not renewed (%r); trying again", exc)
                self._failing = True
            except Exception:  # a bug: said once, and the renewals go on
                if not self._failing:
                    logger.exception("IMAP connection slots not renewed; trying again")
                self._failing = True
            else:
                if self._failing:
                    logger.info("IMAP connection slots renewed again")
                self._failing = False

    async def aclose(self) -> None:
        self._held.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
