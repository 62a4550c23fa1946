"""Replay of failed attempts against real Postgres."""

from __future__ import annotations

import pytest

from mailroom.db.engine import transaction
from mailroom.errors import ReplayRefused
from mailroom.recognition.replay import replay_job, replay_jobs_by_status
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")


@pytest.mark.parametrize("status", ["dlq", "timeout", "error"])
async def test_replay_adds_a_queued_attempt_that_becomes_the_current_job(
    db_sessions, recognition_factory, status
):
    ref = await recognition_factory.create_job(status=status, file_status="ERROR", error_code="X")
    await recognition_factory._execute(
        "UPDATE inbound_mail SET status = 'final', finalized_at = now() WHERE id = :id",
        {"id": ref.mail_id},
    )

    async with transaction(db_sessions) as session:
        replayed = await replay_job(
            session, ref.job_id, actor_type="operator", actor_id="alice", reason="fixed", now=T0
        )

    old, new = await recognition_factory.jobs_of_file(ref.file_id)
    assert (old["id"], old["status"]) == (ref.job_id, status), "the old attempt stays on record"
    assert (new["id"], new["attempt"], new["status"]) == (replayed.new_job_id, 2, "queued")
    assert new["request_msg_id"] == f"{replayed.new_job_id}:2:request"
    assert new["pipeline"] == old["pipeline"]
    file = await recognition_factory.file(ref.file_id)
    assert (file["status"], file["current_recognition_job_id"]) == ("UPLOADED", replayed.new_job_id)
    mail = await recognition_factory.mail(ref.mail_id)
    assert (mail["status"], mail["finalized_at"]) == ("stored", None), "the mail is reopened"
    [audit] = await recognition_factory.rows("SELECT * FROM audit_event")
    assert (audit["action"], audit["actor_type"], audit["actor_id"]) == (
        "recognition.replayed",
        "operator",
        "alice",
    )
    assert audit["target"] == f"recognition_job:{ref.job_id}"
    assert audit["detail"]["new_job_id"] == str(replayed.new_job_id)
    assert audit["detail"]["previous_status"] == status


@pytest.mark.parametrize("status", ["queued", "published", "processing", "done", "needs_check"])
async def test_only_failed_attempts_replay(db_sessions, recognition_factory, status):
    ref = await recognition_factory.create_job(status=status)
    with pytest.raises(ReplayRefused, match=status):
        async with transaction(db_sessions) as session:
            await replay_job(session, ref.job_id, actor_type="operator", actor_id="alice")
    assert len(await recognition_factory.jobs_of_file(ref.file_id)) == 1


async def test_an_old_attempt_or_unknown_job_does_not_replay(db_sessions, recognition_factory):
    old = await recognition_factory.create_job(status="dlq", current=False)
    await recognition_factory.create_job(file_id=old.file_id, attempt=2, status="timeout")
    import uuid

    for job_id in (old.job_id, uuid.uuid4()):
        with pytest.raises(ReplayRefused):
            async with transaction(db_sessions) as session:
                await replay_job(session, job_id, actor_type="operator", actor_id="alice")


async def test_replay_by_status_is_bounded_and_takes_current_jobs_only(
    db_sessions, recognition_factory
):
    refs = [await recognition_factory.create_job(status="dlq") for _ in range(3)]
    await recognition_factory.create_job(status="timeout")
    stale = await recognition_factory.create_job(status="dlq", current=False)

    async with transaction(db_sessions) as session:
        first = await replay_jobs_by_status(
            session, "dlq", limit=2, actor_type="cli", actor_id="ops"
        )
    async with transaction(db_sessions) as session:
        rest = await replay_jobs_by_status(
            session, "dlq", limit=10, actor_type="cli", actor_id="ops"
        )

    assert len(first) == 2 and len(rest) == 1
    assert {r.old_job_id for r in first + rest} == {r.job_id for r in refs}
    assert stale.job_id not in {r.old_job_id for r in first + rest}
    with pytest.raises(ReplayRefused):
        async with transaction(db_sessions) as session:
            await replay_jobs_by_status(session, "done", limit=1, actor_type="cli", actor_id="ops")
