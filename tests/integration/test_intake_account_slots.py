"""Account connection slots on a real Redis: held while a process lives, freed when it dies.

A worker killed mid-poll closes its sockets with it; its slots must not keep the account's
other polls out ("the account's N IMAP connections are in use") for longer than a lease.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest
import redis.asyncio as aioredis
from redis.exceptions import MaxConnectionsError

from mailroom.adapters.redis_client import async_client
from mailroom.intake.account_slots import AccountSlots, SlotKeeper
from mailroom.intake.connections import ConnectionPool, account_key
from mailroom.settings import RedisSettings

pytestmark = pytest.mark.integration

#: A short lease: renewed a third of it, so a live holder outlasts it many times over.
LEASE_S = 3.0
#: Longest a test waits for a slot to free, in seconds (a loaded machine).
PATIENCE_S = 30.0

HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from mailroom.adapters.redis_client import async_client
    from mailroom.intake.account_slots import AccountSlots, SlotKeeper
    from mailroom.settings import RedisSettings

    async def main(url, namespace, lease_s):
        slots = AccountSlots(async_client(url, RedisSettings(url=url)), namespace=namespace,
                             limit=3, ttl_s=float(lease_s))
        keeper = SlotKeeper(slots)
        for n in range(3):
            assert await slots.take("acct", f"poll-{n}")
            keeper.hold("acct", f"poll-{n}")
        print("held", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(*sys.argv[1:]))
    """
)


async def _until_free(slots: AccountSlots, account: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE_S
    while await slots.held(account):
        assert loop.time() < deadline, "the slots were never freed"
        await asyncio.sleep(0.1)


async def test_a_process_that_dies_frees_its_accounts_slots_within_a_lease(redis_url):
    namespace = f"s{uuid.uuid4().hex[:8]}"
    redis = async_client(redis_url, RedisSettings(url=redis_url))
    slots = AccountSlots(redis, namespace=namespace, limit=3, ttl_s=LEASE_S)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, redis_url, namespace, str(LEASE_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert await asyncio.to_thread(holder.stdout.readline) == "held\n"
        # Given a live holder, its slots outlast their lease: the keeper renews them
        await asyncio.sleep(LEASE_S * 1.5)
        assert await slots.held("acct") == 3
        assert not await slots.take("acct", "another-poll")
        # When it is killed (no clean-up), its slots free within a lease
        holder.send_signal(signal.SIGKILL)
        await asyncio.to_thread(holder.wait)
        await _until_free(slots, "acct")
        assert await slots.take("acct", "another-poll")
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
        await redis.aclose()


async def test_a_kept_connection_keeps_its_slot_until_the_pool_closes(intake_env, redis_url):
    box = intake_env.settings.intake.mailboxes[0]
    redis = async_client(redis_url, RedisSettings(url=redis_url))
    slots = AccountSlots(redis, namespace=f"s{uuid.uuid4().hex[:8]}", limit=3, ttl_s=LEASE_S)
    pool = ConnectionPool(slots=slots)
    try:
        mailbox = pool(box)
        await mailbox.connect()
        await mailbox.select(box.folder)
        await mailbox.close()  # kept for the next poll, logged in
        # Given a connection kept past its slot's lease, the slot is still held
        await asyncio.sleep(LEASE_S * 1.5)
        assert await slots.held(account_key(box)) == 1
        # When the pool closes (the worker stops), the connection and its slot go
        await pool.aclose()
        assert await slots.held(account_key(box)) == 0
    finally:
        await pool.aclose()
        await redis.aclose()


async def test_a_slot_lost_while_its_connection_is_open_is_said_once(redis_url, caplog):
    redis = async_client(redis_url, RedisSettings(url=redis_url))
    slots = AccountSlots(redis, namespace=f"s{uuid.uuid4().hex[:8]}", limit=1, ttl_s=LEASE_S)
    keeper = SlotKeeper(slots)
    try:
        assert await slots.take("acct", "poll-1")
        keeper.hold("acct", "poll-1")
        # When its lease ran out unrenewed (Redis away) and another took the only slot
        await redis.delete(slots.prefix + "acct")
        assert await slots.take("acct", "poll-elsewhere")
        # Then renewing says so, once, and leaves the other's slot alone
        await keeper.renew()
        await keeper.renew()
        lost = [r for r in caplog.records if "lost while its connection is open" in r.message]
        assert len(lost) == 1
        assert await slots.held("acct") == 1
        assert not await slots.take("acct", "poll-1")
    finally:
        await keeper.aclose()
        await redis.aclose()


async def test_renewals_falling_due_together_share_a_few_redis_connections(redis_url):
    # 300 watched accounts whose renewals fall due at once (watches started together)
    async def take_all(slots: AccountSlots) -> list[object]:
        calls = (slots.take(f"acct-{n}", f"watch-{n}") for n in range(300))
        return await asyncio.gather(*calls, return_exceptions=True)

    async def clients() -> int:
        count: int = (await probe.info("clients"))["connected_clients"]
        return count

    probe = aioredis.Redis.from_url(redis_url)
    bounded = async_client(redis_url, RedisSettings(url=redis_url))
    unbounded = async_client(redis_url, RedisSettings(url=redis_url))
    namespace = f"s{uuid.uuid4().hex[:8]}"
    try:
        # Bounded as the watcher's are: every renewal done, over at most 4 connections
        before = await clients()
        slots = AccountSlots(bounded, namespace=namespace, limit=3, ttl_s=LEASE_S, max_in_flight=4)
        assert await take_all(slots) == [True] * 300
        assert await clients() - before <= 4
        # Unbounded, the client's pool (100 connections) refuses the calls past it
        slots = AccountSlots(unbounded, namespace=namespace + "u", limit=3, ttl_s=LEASE_S)
        refused = [r for r in await take_all(slots) if isinstance(r, MaxConnectionsError)]
        assert refused
    finally:
        for client in (probe, bounded, unbounded):
            await client.aclose()
