"""The retention pass on Postgres and S3 (moto): bounded batches, holds, shared objects, crashes."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select, update

import actors.middleware.resources
from actors import queues
from actors.retention import apply_retention
from mailroom.db.engine import transaction
from mailroom.db.models import (
    AuditEvent,
    Document,
    InboundMail,
    ObjectDeletion,
    RecognitionJob,
    StoredFile,
)
from mailroom.errors import ReplayRefused
from mailroom.lifecycle.retention import PURGE_ACTION, purge_batch, run_retention_pass
from mailroom.recognition.replay import replay_job, replay_jobs_by_status
from mailroom.settings import Settings

pytestmark = pytest.mark.integration


async def _mail(world, mail_id):
    async with world.sessions() as session:
        return await session.get(InboundMail, mail_id)


async def test_old_settled_mails_lose_their_objects_in_batches_recent_held_and_open_stay(
    lifecycle_world,
):
    world = lifecycle_world
    old = [await world.mail(age_days=40) for _ in range(3)]
    recent = await world.mail(age_days=5)
    held = await world.mail(age_days=40, held=True)
    in_flight = await world.mail(age_days=40, job_status="processing")
    unmapped = await world.mail(age_days=40)
    async with transaction(world.sessions) as session:  # a result mapping has still to read
        await session.execute(
            update(RecognitionJob)
            .where(RecognitionJob.id == unmapped.job_id)
            .values(result_msg_id="job:1:result")
        )
    settings = world.with_retention(30, batch_size=2, deletion_grace_s=0)

    report = await run_retention_pass(world.sessions, world.store, settings)

    assert report.purged == {"billing": 3}
    assert report.deletion.deleted == 9  # body, attachment and result of each
    for rows in old:
        assert await world.stored(rows) == [False, False, False]
        mail = await _mail(world, rows.mail_id)
        assert mail.purged_at is not None and mail.raw_object_id is None
    for rows in (recent, held, in_flight, unmapped):
        assert await world.stored(rows) == [True, True, True]
        assert (await _mail(world, rows.mail_id)).purged_at is None
    async with world.sessions() as session:
        events = list(
            await session.scalars(
                select(AuditEvent).where(AuditEvent.action == PURGE_ACTION).order_by(AuditEvent.id)
            )
        )
        documents = len(list(await session.scalars(select(Document.id))))
        files = list(await session.scalars(select(StoredFile).order_by(StoredFile.id)))
    assert [e.detail["mails"] for e in events] == [2, 1], "one event per bounded batch"
    assert events[0].target == "mailbox:billing" and events[0].detail["objects_queued"] == 6
    assert documents == 7, "documents are kept after the bodies are gone"
    assert [f.object_id is None for f in files] == [True] * 3 + [False] * 4
    assert (await run_retention_pass(world.sessions, world.store, settings)).purged == {}


async def test_a_shared_object_stays_while_referred_to_and_goes_with_its_last_reference(
    lifecycle_world,
):
    world = lifecycle_world
    same = b"invoice_number,total\nSHARED-1,10\n"
    older = await world.mail(age_days=40, attachment=same)
    newer = await world.mail(age_days=10, attachment=same)
    assert older.objects[1] == newer.objects[1], "one content-addressed object, two files"

    await run_retention_pass(
        world.sessions, world.store, world.with_retention(30, deletion_grace_s=0)
    )
    assert await world.stored(older) == [False, True, False]
    assert await world.stored(newer) == [True, True, True]

    await run_retention_pass(
        world.sessions, world.store, world.with_retention(7, deletion_grace_s=0)
    )
    assert await world.stored(newer) == [False, False, False]


async def test_a_crash_between_commit_and_delete_is_finished_by_a_later_pass(lifecycle_world):
    world = lifecycle_world
    rows = await world.mail(age_days=40)
    # The batch commits and the process dies before deleting anything from S3.
    async with transaction(world.sessions) as session:
        batch = await purge_batch(session, mailbox="billing", retention_days=30, limit=10)
    assert batch.mails == 1 and batch.objects_queued == 3
    assert await world.stored(rows) == [True, True, True]

    # Within the grace period the queued objects wait (intake may be storing them anew).
    waiting = await run_retention_pass(world.sessions, world.store, world.with_retention(30))
    assert waiting.deletion.deleted == 0
    assert await world.stored(rows) == [True, True, True]

    settings = world.with_retention(30, deletion_grace_s=0)
    finished = await run_retention_pass(world.sessions, world.store, settings)
    assert finished.deletion.deleted == 3
    assert await world.stored(rows) == [False, False, False]
    async with world.sessions() as session:
        assert list(await session.scalars(select(ObjectDeletion))) == []


async def test_an_object_stored_again_after_it_was_queued_is_kept(lifecycle_world):
    world = lifecycle_world
    same_body = b"Subject: again\r\n\r\nthe same bytes\r\n"
    rows = await world.mail(age_days=40, body=same_body)
    async with transaction(world.sessions) as session:
        await purge_batch(session, mailbox="billing", retention_days=30, limit=10)
    # Intake stores the same mail again before the queued deletion runs.
    again = await world.mail(age_days=0, body=same_body)

    settings = world.with_retention(30, deletion_grace_s=0)
    report = await run_retention_pass(world.sessions, world.store, settings)
    assert report.deletion.kept == 1 and report.deletion.deleted == 2
    assert (await world.stored(again))[0] is True
    assert (await world.stored(rows))[1:] == [False, False]


@pytest.fixture
def retention_resources(lifecycle_world):
    """Actors use these settings (request before ``stub_worker``: it closes what they built)."""
    actors.middleware.resources.configure(lifecycle_world.with_retention(30, deletion_grace_s=0))
    yield lifecycle_world
    actors.middleware.resources.configure(Settings())


async def test_the_scheduler_s_actor_runs_the_pass_on_a_worker(
    retention_resources, stub_broker, stub_worker
):
    world = retention_resources
    rows = await world.mail(age_days=40)
    apply_retention.send()

    def drain() -> None:
        stub_broker.join(queues.MAINTENANCE, fail_fast=True)
        stub_worker.join()

    await asyncio.to_thread(drain)
    assert await world.stored(rows) == [False, False, False]
    assert (await _mail(world, rows.mail_id)).purged_at is not None


async def test_a_job_of_a_purged_mail_is_not_replayed(lifecycle_world):
    world = lifecycle_world
    rows = await world.mail(age_days=40)
    async with transaction(world.sessions) as session:
        await purge_batch(session, mailbox="billing", retention_days=30, limit=10)
        await session.execute(
            update(RecognitionJob).where(RecognitionJob.id == rows.job_id).values(status="error")
        )
    async with transaction(world.sessions) as session:
        with pytest.raises(ReplayRefused, match="removed by retention"):
            await replay_job(session, rows.job_id, actor_type="operator", actor_id="ops")
        replayed = await replay_jobs_by_status(
            session, "error", limit=10, actor_type="operator", actor_id="ops"
        )
    assert replayed == []
