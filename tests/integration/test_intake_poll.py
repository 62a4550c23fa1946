"""Intake against pymap (and Dovecot, for what servers differ on) and Postgres: ordered ingest,
resumption, leases, concurrency."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest
from sqlalchemy import select, text, update

from mailroom.adapters.imap import ImapMailbox
from mailroom.adapters.storage import sha256_hex
from mailroom.db.models import MailboxCursor
from mailroom.intake.poll import poll_mailbox
from tests.fixtures.imap import csv_mail, make_mail, on_every_server

pytestmark = pytest.mark.integration


@on_every_server
async def test_mails_are_stored_in_uid_order_with_their_files_and_queued_jobs(intake_env):
    uids = intake_env.append(*(csv_mail(n) for n in range(3)))

    outcome = await intake_env.poll()

    assert outcome.status == "done"
    mails = await intake_env.mails()
    assert [m.uid for m in mails] == uids
    assert [m.subject for m in mails] == ["mail 0", "mail 1", "mail 2"]
    assert all(m.status == "stored" and m.raw_object_id for m in mails)
    assert [m.sender for m in mails] == [f"sender{n}@example.com" for n in range(3)]
    assert all(len(m.content_sha256 or "") == 64 for m in mails)
    files = await intake_env.files()
    assert [f.original_name for f in files] == ["rates-0.csv", "rates-1.csv", "rates-2.csv"]
    jobs = {j.id: j for j in await intake_env.jobs()}
    for file in files:
        job = jobs[file.current_recognition_job_id]
        assert (job.file_id, job.pipeline, job.status, job.attempt) == (
            file.id,
            "tabular",
            "queued",
            1,
        )
    assert file.status == "UPLOADED"
    assert len(intake_env.nudges) == 1, "one nudge for the jobs of the group"
    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.last_uid, cursor.lease_id, cursor.retry_count) == (
        "idle",
        uids[-1],
        None,
        0,
    )
    # The stored .eml is the mail, byte for byte.
    sha = mails[0].content_sha256
    raw = await intake_env.store.get("mailroom-mail", f"mail/{sha[:2]}/{sha}.eml")
    assert b"Subject: mail 0" in raw and sha256_hex(raw) == sha


@on_every_server
async def test_a_second_poll_reads_only_new_mail(intake_env):
    intake_env.append(csv_mail(1))
    await intake_env.poll()
    first = await intake_env.cursor()

    outcome = await intake_env.poll()
    assert outcome.status == "done"
    assert outcome.result.ingested == 0  # the N:* quirk returned the last mail: filtered out

    (uid,) = intake_env.append(csv_mail(2))
    await intake_env.poll()
    assert [m.uid for m in await intake_env.mails()] == [first.last_uid, uid]


@on_every_server
async def test_a_full_batch_says_more_mail_is_waiting(intake_env):
    intake_env.settings.intake.mailboxes[0].batch_size = 2
    uids = intake_env.append(*(make_mail(n) for n in range(5)))

    first = await intake_env.poll()
    assert first.more_waiting
    assert (await intake_env.cursor()).last_uid == uids[1]
    second = await intake_env.poll()
    third = await intake_env.poll()
    assert second.more_waiting and not third.more_waiting
    assert [m.uid for m in await intake_env.mails()] == uids


async def test_a_batch_cancelled_between_mails_resumes_without_loss_or_duplicates(intake_env):
    intake_env.settings.intake.commit_group = 2
    uids = intake_env.append(*(csv_mail(n) for n in range(6)))
    committed = asyncio.Event()

    async def nudge_then_stall() -> None:
        committed.set()
        await asyncio.sleep(3600)  # the worker "dies" here, after the first group of two

    deps = dataclasses.replace(intake_env.deps(), nudge=nudge_then_stall)
    task = asyncio.create_task(poll_mailbox("box", settings=intake_env.settings.intake, deps=deps))
    await asyncio.wait_for(committed.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # a shutdown's cancellation propagates

    stuck = await intake_env.cursor()
    assert stuck.status == "processing" and stuck.last_uid == uids[1]
    assert (await intake_env.poll()).reason == "leased"  # the dead worker's lease is live
    intake_env.clock.advance(intake_env.settings.intake.lease_s + 1)

    outcome = await intake_env.poll()

    assert outcome.status == "done"
    assert [m.uid for m in await intake_env.mails()] == uids
    assert len(await intake_env.jobs()) == 6


async def test_lost_lease_stops_the_batch_at_the_next_fence(intake_env):
    uids = intake_env.append(*(make_mail(n) for n in range(4)))
    stolen = False

    class StealAfterFirstFetch(ImapMailbox):
        async def fetch(self, wanted):
            nonlocal stolen
            mails = await super().fetch(wanted)
            if not stolen:
                stolen = True
                async with intake_env.sessions() as session, session.begin():
                    await session.execute(update(MailboxCursor).values(lease_id=uuid.uuid4()))
            return mails

    outcome = await intake_env.poll(connect=StealAfterFirstFetch)

    assert outcome.status == "lease_lost"
    assert await intake_env.mails() == []
    cursor = await intake_env.cursor()
    assert cursor.last_uid == 0 and cursor.status == "processing"
    # The thief's lease expires; the same worker then reads everything once.
    intake_env.clock.advance(intake_env.settings.intake.lease_s + 1)
    assert (await intake_env.poll()).status == "done"
    assert [m.uid for m in await intake_env.mails()] == uids


class SlowLogin(ImapMailbox):
    """The real adapter, with a server that takes its time to log in."""

    async def connect(self) -> None:
        await asyncio.sleep(30)


async def test_heartbeat_that_cannot_renew_cancels_only_the_batch(intake_env):
    intake_env.settings.intake.lease_s = 0.3

    async def steal_soon() -> None:
        # Steal only once the poll holds the lease (under load the claim can come late).
        while True:
            async with intake_env.sessions() as session:
                status = await session.scalar(select(MailboxCursor.status))
            if status == "processing":
                break
            await asyncio.sleep(0.02)
        async with intake_env.sessions() as session, session.begin():
            await session.execute(update(MailboxCursor).values(lease_id=uuid.uuid4()))

    thief = asyncio.create_task(steal_soon())
    started = asyncio.get_running_loop().time()
    outcome = await intake_env.poll(connect=SlowLogin)  # waits until the heartbeat gives up
    await thief

    assert outcome.status == "lease_lost"
    assert asyncio.get_running_loop().time() - started < 3


async def test_two_workers_polling_one_mailbox_ingest_each_uid_once(intake_env):
    uids = intake_env.append(*(csv_mail(n) for n in range(8)))

    outcomes = await asyncio.gather(*(intake_env.poll() for _ in range(4)))

    statuses = sorted(o.status for o in outcomes)
    assert statuses.count("done") == 1, statuses
    assert all(o.reason == "leased" for o in outcomes if o.status == "skipped")
    assert [m.uid for m in await intake_env.mails()] == uids
    assert len(await intake_env.jobs()) == 8


async def test_first_polls_racing_to_create_the_cursor_both_survive(intake_env):
    outcomes = await asyncio.gather(intake_env.poll(), intake_env.poll())
    assert sorted(o.status for o in outcomes) in (["done", "skipped"], ["done", "done"])
    assert (await intake_env.cursor()).status == "idle"


async def test_a_batch_cancelled_while_postgres_runs_its_group_loses_and_repeats_nothing(
    intake_env,
):
    await intake_env.add_mail_trigger(
        "slow_mail", "IF NEW.subject = 'SLOW' THEN PERFORM pg_sleep(2); END IF;"
    )
    slow = make_mail(9, subject="SLOW", message_id="<slow@example.com>")
    uids = intake_env.append(csv_mail(1), csv_mail(2), slow, csv_mail(3), csv_mail(4))

    async def sleeping_backends() -> int:
        async with intake_env.sessions() as session:
            return await session.scalar(
                text("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
            )

    task = asyncio.create_task(intake_env.poll())
    while not await sleeping_backends():  # the group is in Postgres, at the slow mail
        assert not task.done()
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    while await sleeping_backends():  # the abandoned backend finishes what it had
        await asyncio.sleep(0.05)

    intake_env.clock.advance(intake_env.settings.intake.lease_s + 1)
    outcome = await intake_env.poll()

    assert outcome.status == "done"
    assert [m.uid for m in await intake_env.mails()] == uids
    assert len(await intake_env.jobs()) == 4
    assert (await intake_env.cursor()).last_uid == uids[-1]


@on_every_server
async def test_fetches_are_cut_by_bytes_and_every_mail_still_arrives_in_order(intake_env):
    intake_env.settings.intake.fetch_chunk_bytes = 1  # every mail is bigger: one per FETCH
    uids = intake_env.append(*(csv_mail(n) for n in range(4)))
    fetched: list[list[int]] = []

    class Recording(ImapMailbox):
        async def fetch(self, wanted):
            fetched.append(list(wanted))
            return await super().fetch(wanted)

    assert (await intake_env.poll(connect=Recording)).status == "done"

    assert fetched == [[uid] for uid in uids]
    assert [m.uid for m in await intake_env.mails()] == uids
    assert len(await intake_env.jobs()) == 4
