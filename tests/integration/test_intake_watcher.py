"""The IMAP watcher on pymap (IDLE) and Dovecot (NOTIFY): new mail becomes a poll at once,
several watchers share the accounts, and every process's connections stay under the cap."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from mailroom.adapters.redis_client import async_client
from mailroom.devtools.dovecot import DovecotServer
from mailroom.intake.account_slots import KEY_PART, AccountSlots
from mailroom.intake.connections import account_key
from mailroom.settings import BrokerSettings, RedisSettings
from mailroom.watcher.service import Watcher
from tests.fixtures.imap import csv_mail, new_folder, on_every_server

pytestmark = pytest.mark.integration

#: Longest a test waits for something the watcher does, in seconds (a loaded machine).
PATIENCE_S = 60.0


async def _until(what: str, check, timeout_s: float = PATIENCE_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
def watch_settings(intake_env, redis_url):
    """The test's settings with Redis, a namespace of its own and quick leases."""
    settings = intake_env.settings.model_copy(
        update={
            "redis": RedisSettings(url=redis_url),
            "broker": BrokerSettings(namespace=f"w{uuid.uuid4().hex[:8]}"),
        }
    )
    settings.intake.watch_lease_s = 3.0
    for mailbox in settings.intake.mailboxes:
        mailbox.idle = True
    return settings


class Polls:
    """A ``send`` that polls at once in the test's loop, as a worker would."""

    def __init__(self, intake_env) -> None:
        self.env = intake_env
        self.loop = asyncio.get_running_loop()
        self.sent: list[str] = []
        self.tasks: set[asyncio.Future] = set()

    def __call__(self, name: str) -> None:  # called on the watcher's sending thread
        self.loop.call_soon_threadsafe(self._poll, name)

    def _poll(self, name: str) -> None:
        self.sent.append(name)
        task = asyncio.ensure_future(self.env.poll(name))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self) -> None:
        await asyncio.gather(*list(self.tasks), return_exceptions=True)


async def _start(watch_settings, intake_env, send, holder: str) -> tuple[Watcher, asyncio.Task]:
    redis = async_client(watch_settings.stream_redis_url, watch_settings.redis)
    watcher = Watcher(
        settings=watch_settings,
        sessions=intake_env.sessions,
        redis=redis,
        send=send,
        holder=holder,
    )
    return watcher, asyncio.create_task(watcher.run())


async def _stop(watcher: Watcher, task: asyncio.Task) -> None:
    watcher.stop.set()
    await asyncio.wait_for(task, 10)
    await watcher.leases.client.aclose()


def _watching(watcher: Watcher) -> set[str]:
    return {folder for watch, _ in watcher.watches.values() for folder in watch.watching}


@on_every_server
async def test_new_mail_in_a_watched_folder_is_stored_without_a_scheduler_pass(
    intake_env, watch_settings
):
    polls = Polls(intake_env)
    watcher, task = await _start(watch_settings, intake_env, polls, "w1")
    try:
        await _until("the folder watched", lambda: _async(intake_env.folder in _watching(watcher)))
        await _until("the first poll", lambda: _async(bool(polls.sent)))
        await polls.drain()
        before = len(polls.sent)

        (uid,) = intake_env.append(csv_mail(1))

        async def stored() -> bool:
            return [m.uid for m in await intake_env.mails()] == [uid]

        await _until("the new mail stored", stored)
        assert len(polls.sent) > before, "a poll the watcher sent stored it"
        expected = "NOTIFY" if isinstance(intake_env.server, DovecotServer) else "IDLE"
        (watch, _), *_ = watcher.watches.values()
        assert watch.mode == expected
    finally:
        await _stop(watcher, task)
        await polls.drain()


async def _async(value):
    return value


@on_every_server
async def test_two_watchers_keep_an_accounts_connections_under_its_cap(intake_env, watch_settings):
    # Twenty folders of one account, two watchers, a cap of 4 connections for everybody.
    server = intake_env.server
    box = watch_settings.intake.mailboxes[0]
    folders = [new_folder(server) for _ in range(20)]
    watch_settings.intake.mailboxes = [
        box.model_copy(update={"name": f"box{i}", "folder": folder})
        for i, folder in enumerate(folders)
    ]
    watch_settings.intake.max_connections_per_account = 4
    watch_settings.intake.watch_connections_per_account = 6
    redis = async_client(watch_settings.stream_redis_url, watch_settings.redis)
    slots = AccountSlots(redis, namespace=watch_settings.broker.namespace, limit=4, ttl_s=3.0)
    account = account_key(box)
    polls = Polls(intake_env)
    first, first_task = await _start(watch_settings, intake_env, polls, "w1")
    second, second_task = await _start(watch_settings, intake_env, polls, "w2")
    peak = 0
    try:

        async def settled() -> bool:
            nonlocal peak
            peak = max(peak, await slots.held(account), first.connections + second.connections)
            return bool(_watching(first) | _watching(second))

        await _until("a watch", settled)
        for _ in range(40):  # a few lease rounds of both
            await settled()
            await asyncio.sleep(0.1)
        assert peak <= 4
        watched = _watching(first) | _watching(second)
        assert bool(_watching(first)) != bool(_watching(second)), "one watcher has the account"
        if isinstance(server, DovecotServer):
            assert watched == set(folders), "NOTIFY: one connection watches all 20"
            assert first.connections + second.connections == 1
        else:
            assert 1 <= len(watched) <= 4, "IDLE: a connection a folder, as many as the cap lets"
    finally:
        await _stop(first, first_task)
        await _stop(second, second_task)
        await polls.drain()
        await redis.aclose()


async def test_a_watch_whose_slot_was_taken_while_it_was_late_closes_its_connection(
    intake_env, watch_settings
):
    # One connection for the account, held by the watcher
    watch_settings.intake.max_connections_per_account = 1
    box = watch_settings.intake.mailboxes[0]
    key = watch_settings.broker.namespace + KEY_PART + account_key(box)
    watcher, task = await _start(watch_settings, intake_env, Polls(intake_env), "w1")
    redis = watcher.leases.client
    try:
        await _until("the folder watched", lambda: _async(intake_env.folder in _watching(watcher)))
        (watch, _), *_ = watcher.watches.values()
        assert watch.connections == 1
        # When its lease ran out unrenewed and someone else took the only slot
        await redis.delete(key)
        await redis.zadd(key, {"poll-elsewhere": 2**52})
        # Then the watch closes its connection at its next renewal: one connection in all
        await _until("the connection closed", lambda: _async(watch.connections == 0))
        assert _watching(watcher) == set()
        # And watches again once the slot is free
        await redis.delete(key)
        await _until("the folder watched again", lambda: _async(bool(_watching(watcher))))
    finally:
        await _stop(watcher, task)


async def test_the_pass_polls_a_live_watched_folder_only_now_and_then(intake_env, watch_settings):
    from mailroom.intake.pending import mark_polls_queued

    async def pass_marks() -> set[str]:
        return await mark_polls_queued(
            intake_env.sessions,
            [("box", intake_env.folder)],
            lost_after_s=900,
            watched_poll_interval_s=600,
        )

    polls = Polls(intake_env)
    watcher, task = await _start(watch_settings, intake_env, polls, "w1")
    try:
        await _until("the first poll", lambda: _async(bool(polls.sent)))
        await polls.drain()

        async def watched() -> bool:
            return (await intake_env.cursor()).watched_until is not None

        await _until("the folder marked watched", watched)
        assert await pass_marks() == set(), "watched live and polled just now: the pass skips it"
    finally:
        await _stop(watcher, task)
        await polls.drain()
    # A watcher that stops says so: the pass polls the folder again at once.
    assert (await intake_env.cursor()).watched_until is None
    assert await pass_marks() == {"box"}


async def test_a_dead_watchers_accounts_are_taken_over_when_its_leases_run_out(
    intake_env, watch_settings
):
    polls = Polls(intake_env)
    first, first_task = await _start(watch_settings, intake_env, polls, "w1")
    await _until("w1 watching", lambda: _async(bool(_watching(first))))
    second, second_task = await _start(watch_settings, intake_env, polls, "w2")
    try:
        # w1 dies: its watches end, and nothing gives its lease back.
        async def nothing() -> None:
            return None

        first.leases.release_all = nothing
        first_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first_task
        assert intake_env.folder not in _watching(second), "the lease is w1's until it runs out"

        await _until("w2 watching", lambda: _async(intake_env.folder in _watching(second)))
        (uid,) = intake_env.append(csv_mail(1))

        async def stored() -> bool:
            return [m.uid for m in await intake_env.mails()] == [uid]

        await _until("the new mail stored", stored)
    finally:
        await first.leases.client.aclose()
        await _stop(second, second_task)
        await polls.drain()


async def test_the_guard_polls_of_watched_folders_are_spread_over_the_passes(intake_env):
    from sqlalchemy import text

    from mailroom.intake.pending import mark_polls_queued

    pairs = [(f"box{n}", f"f{n}") for n in range(10)]
    await mark_polls_queued(intake_env.sessions, pairs, lost_after_s=900)  # creates the cursors
    async with intake_env.sessions() as session, session.begin():
        # All watched live, all last polled an hour ago: all due for their guard poll.
        await session.execute(
            text(
                "UPDATE mailbox_cursor SET poll_queued_at = NULL, "
                "watched_until = now() + interval '30 seconds', "
                "updated_at = now() - interval '1 hour'"
            )
        )

    async def a_pass() -> set[str]:
        return await mark_polls_queued(
            intake_env.sessions,
            pairs,
            lost_after_s=900,
            watched_poll_interval_s=600,
            watched_most=4,
        )

    first, second = await a_pass(), await a_pass()
    assert (len(first), len(second)) == (4, 4) and not first & second
