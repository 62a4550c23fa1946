"""One queued poll per mailbox: the scheduler's pass skips a mailbox whose poll is queued or running.

On real Postgres and pymap: the mark (``mailroom.intake.pending``) against the claim that
clears it, and the actors on the StubBroker, where passes that pile up in the intake
queue send each mailbox one poll, not one per pass.
"""

from __future__ import annotations

import asyncio

import pytest
from dramatiq import Worker
from sqlalchemy import select, update

import actors.intake
import actors.middleware.resources
from actors.intake import poll_mailboxes
from mailroom.db.engine import psycopg_autocommit
from mailroom.db.models import MailboxCursor
from mailroom.intake import cursor as cursors
from mailroom.intake import cursor_failures as failures
from mailroom.intake.cursor_sql import ASYNC_COMMIT, CLAIM_CURSOR, COUNT_ATTEMPT, FINISH_BATCH
from mailroom.intake.pending import mark_polls_queued
from mailroom.settings import (
    DatabaseSettings,
    IntakeSettings,
    RedisSettings,
    Settings,
    StorageSettings,
)
from tests.fixtures.imap import csv_mail

pytestmark = pytest.mark.integration

LOST_AFTER_S = 30.0


async def test_a_mailbox_is_marked_once_until_a_claim_takes_its_poll(intake_env):
    box, other = ("box", intake_env.folder), ("other", intake_env.folder)

    async def mark() -> set[str]:
        return await mark_polls_queued(
            intake_env.sessions, [box, other], lost_after_s=LOST_AFTER_S, clock=intake_env.clock
        )

    assert await mark() == {"box", "other"}, "new mailboxes: cursors created and marked"
    assert await mark() == set(), "both polls still queued"

    (uid,) = intake_env.append(csv_mail(1))
    outcome = await intake_env.poll("box")
    assert outcome.status == "done" and [m.uid for m in await intake_env.mails()] == [uid]
    assert await mark() == {"box"}, "box's poll was claimed; other's is still queued"

    intake_env.clock.advance(LOST_AFTER_S + 1)
    assert await mark() == {"box", "other"}, "a mark older than lost_after_s is a lost message"

    # A running poll (leased) gets no second one; nor does a cursor backing off or blocked.
    claim = await cursors.claim_cursor(
        intake_env.sessions,
        mailbox="box",
        folder=intake_env.folder,
        lease_s=30.0,
        clock=intake_env.clock,
    )
    assert isinstance(claim, cursors.Claim)
    assert "box" not in await mark(), "leased: its poll is running"
    failure = await failures.record_batch_failure(
        intake_env.sessions,
        claim,
        error=OSError("imap down"),
        max_backoff_s=60,
        clock=intake_env.clock,
    )
    assert failure.next_retry_at is not None
    assert "box" not in await mark(), "backing off: the claim would skip it"
    intake_env.clock.advance(61)
    assert "box" in await mark(), "the backoff ran out"

    async with intake_env.sessions() as session, session.begin():
        await session.execute(
            update(MailboxCursor)
            .where(MailboxCursor.mailbox == "box")
            .values(status="blocked", poll_queued_at=None)
        )
    assert "box" not in await mark(), "blocked: only an operator's unblock polls it again"


async def test_news_for_a_cursor_locked_by_a_finishing_poll_waits_and_marks_it(intake_env):
    box = ("box", intake_env.folder)

    async def news() -> set[str]:
        return await mark_polls_queued(
            intake_env.sessions, [box], lost_after_s=LOST_AFTER_S, leased_too=True
        )

    assert await news() == {"box"}
    assert (await intake_env.poll("box")).status == "done"  # the claim clears the mark
    # Given a transaction holding the cursor's row (a poll's finish, its lease renewal)
    async with intake_env.sessions() as holder, holder.begin():
        await holder.execute(
            select(MailboxCursor.id).where(MailboxCursor.mailbox == "box").with_for_update()
        )
        # When the watcher's news comes meanwhile
        marking = asyncio.create_task(news())
        await asyncio.sleep(0.5)
    # Then it is marked once the row is free, not dropped (its poll may have searched before)
    assert await marking == {"box"}


@pytest.fixture
def settings(database_url, redis_url, tmp_path, imap_server, imap_folder):
    mailboxes = [
        imap_server.mailbox_settings(name, imap_folder, idle=False) for name in ("a", "b", "c")
    ]
    settings = Settings(
        state_dir=tmp_path,
        database=DatabaseSettings(url=database_url, pool_size=2),
        # The passes' marks (outbox nudge, notifications) live in Redis, as in production.
        redis=RedisSettings(url=redis_url),
        storage=StorageSettings(kind="filesystem"),
        intake=IntakeSettings(mailboxes=mailboxes),
    )
    actors.middleware.resources.configure(settings)
    return settings


def test_passes_piled_up_in_the_queue_send_each_mailbox_one_poll(
    settings, stub_broker, imap_server, imap_folder, monkeypatch
):
    polled: list[str] = []
    real_poll = actors.intake.poll

    async def counting_poll(name, **kwargs):
        polled.append(name)
        return await real_poll(name, **kwargs)

    monkeypatch.setattr(actors.intake, "poll", counting_poll)
    imap_server.append(imap_folder, csv_mail(1), csv_mail(2))

    def run_intake_queue() -> None:
        # One thread: the queue is served in order, as a backlog is.
        worker = Worker(stub_broker, worker_timeout=100, worker_threads=1, queues={"intake"})
        worker.start()
        try:
            stub_broker.join("intake", fail_fast=True)
            worker.join()
        finally:
            worker.stop()

    # Two passes queued before any poll runs (a backlog): the second finds every poll queued.
    poll_mailboxes.send()
    poll_mailboxes.send()
    run_intake_queue()
    # Without IDLE, a poll that stored mail does not poll again at once: the next pass does.
    assert sorted(polled) == ["a", "b", "c"]

    polled.clear()
    poll_mailboxes.send()
    run_intake_queue()
    assert sorted(polled) == ["a", "b", "c"], "the polls were claimed: the next pass sends again"
    assert stub_broker.dead_letters == []


async def test_the_lease_bookkeeping_commits_without_a_flush_and_leaves_the_pool_as_it_was(
    intake_env, monkeypatch
):
    import psycopg
    from sqlalchemy import event, text

    from mailroom.db.engine import transaction

    engine = intake_env.sessions.kw["bind"].sync_engine
    sent: list[str] = []

    def record(conn, cursor, statement, *args) -> None:
        sent.append(statement)

    # The claim, the count and the finish go to psycopg directly, one statement each.
    direct = psycopg.AsyncConnection.execute

    async def execute(self, query, *args, **kwargs):
        sent.append(query)
        return await direct(self, query, *args, **kwargs)

    # The folder's first claim creates its cursor (two more statements); the next ones do not.
    first = await cursors.claim_cursor(
        intake_env.sessions, mailbox="box", folder=intake_env.folder, lease_s=30
    )
    assert isinstance(first, cursors.Claim)
    await cursors.finish_batch(intake_env.sessions, first, highest_uid=0)
    monkeypatch.setattr(psycopg.AsyncConnection, "execute", execute)
    async with transaction(intake_env.sessions) as session:
        server_default = await session.scalar(text("SHOW synchronous_commit"))
    event.listen(engine, "before_cursor_execute", record)
    try:
        claim = await cursors.claim_cursor(
            intake_env.sessions, mailbox="box", folder=intake_env.folder, lease_s=30
        )
        assert isinstance(claim, cursors.Claim)
        assert await cursors.count_attempt(intake_env.sessions, claim, 0) == 1
        await cursors.finish_batch(intake_env.sessions, claim, highest_uid=0)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert sent == [CLAIM_CURSOR, COUNT_ATTEMPT, FINISH_BATCH], "one statement each, nothing else"
    assert all(ASYNC_COMMIT in statement for statement in sent)
    # The statement's own transaction commits asynchronously, and only it.
    async with psycopg_autocommit(intake_env.sessions) as pg:
        setting = await pg.execute(
            f"UPDATE mailbox_cursor SET updated_at = now() WHERE {ASYNC_COMMIT}"
            " RETURNING current_setting('synchronous_commit')"
        )
        assert await setting.fetchone() == ("off",)
        after = await pg.execute("SHOW synchronous_commit")
        assert await after.fetchone() == (server_default,)
    assert (await intake_env.cursor()).attempt_count == 0, "the finish cleared the count"
    # SET LOCAL ends with its transaction: the next user of a pooled connection is as before.
    for _ in range(3):
        async with transaction(intake_env.sessions) as session:
            assert await session.scalar(text("SHOW synchronous_commit")) == server_default
