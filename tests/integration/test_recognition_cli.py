"""`mailroom recognition status|replay` against a real database (typer's CliRunner)."""

from __future__ import annotations

import getpass
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from actors import queues
from mailroom.cli import app
from mailroom.db.models import AuditEvent, RecognitionJob, StoredFile, StoredObject

pytestmark = pytest.mark.integration

runner = CliRunner()


@pytest.fixture
def db(database_url, monkeypatch):
    """A sync session on the test database, which the CLI reads from the environment."""
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    engine = sqlalchemy.create_engine(database_url)
    with Session(engine, expire_on_commit=False) as session:
        yield session
    engine.dispose()


def add_job(
    session: Session,
    *,
    status: str,
    pipeline: str = "tabular",
    file_status: str = "ERROR",
    published_ago: timedelta | None = None,
    finished_ago: timedelta = timedelta(minutes=1),
) -> RecognitionJob:
    """A stored file whose current (and only) job is in ``status``."""
    stored = StoredObject(
        bucket_role="incoming",
        bucket="mailroom-incoming",
        key=f"files/{uuid.uuid4().hex}",
        created_by="test",
    )
    session.add(stored)
    session.flush()
    file = StoredFile(
        original_name="a.csv", file_type="csv", status=file_status, object_id=stored.id
    )
    session.add(file)
    session.flush()
    now = datetime.now(UTC)
    job = RecognitionJob(
        id=uuid.uuid4(),
        file_id=file.id,
        pipeline=pipeline,
        status=status,
        attempt=1,
        published_at=now - published_ago if published_ago else None,
        finished_at=now - finished_ago if status in ("done", "error", "timeout", "dlq") else None,
    )
    session.add(job)
    session.flush()
    file.current_recognition_job_id = job.id
    session.commit()
    return job


def invoke(*args: str):
    return runner.invoke(app, ["recognition", *args])


def outbox_messages(broker) -> int:
    return broker.queues[queues.OUTBOX].qsize()


def test_status_shows_job_counts_per_pipeline_file_counts_and_oldest_unacked(db):
    add_job(db, status="done", file_status="RECOGNIZED")
    add_job(db, status="done", file_status="RECOGNIZED")
    add_job(db, status="dlq", pipeline="image")
    add_job(db, status="published", file_status="UPLOADED", published_ago=timedelta(seconds=95))
    add_job(db, status="published", file_status="UPLOADED", published_ago=timedelta(seconds=5))

    result = invoke("status")

    assert result.exit_code == 0, result.output
    assert re.search(r"done\s+│\s+2\s+│\s+0\s+│\s+2", result.output), result.output
    assert re.search(r"dlq\s+│\s+0\s+│\s+1\s+│\s+1", result.output), result.output
    assert re.search(r"published\s+│\s+2\s+│\s+0\s+│\s+2", result.output), result.output
    assert re.search(r"RECOGNIZED\s+│\s+2", result.output), result.output
    assert re.search(r"UPLOADED\s+│\s+2", result.output), result.output
    assert re.search(r"ERROR\s+│\s+1", result.output), result.output
    assert re.search(r"Published without ack: 2, oldest waiting 1m 3\ds", result.output)
    # Every status is listed, zero or not.
    assert re.search(r"timeout\s+│\s+0\s+│\s+0\s+│\s+0", result.output), result.output


def test_status_of_an_empty_database(db):
    result = invoke("status")

    assert result.exit_code == 0, result.output
    assert "Published without ack: none" in result.output


def test_replay_one_job_creates_the_next_attempt_audits_it_and_nudges_the_publisher(
    db, stub_broker
):
    old = add_job(db, status="dlq")

    result = invoke("replay", "--job", str(old.id), "--reason", "service fixed")

    assert result.exit_code == 0, result.output
    jobs = db.scalars(
        sqlalchemy.select(RecognitionJob)
        .where(RecognitionJob.file_id == old.file_id)
        .order_by(RecognitionJob.attempt)
    ).all()
    assert [(j.attempt, j.status) for j in jobs] == [(1, "dlq"), (2, "queued")]
    new = jobs[1]
    assert f"replayed job {old.id} (dlq) as {new.id}, attempt 2" in result.output
    file = db.get(StoredFile, old.file_id)
    assert file is not None
    assert file.current_recognition_job_id == new.id
    audit = db.scalars(sqlalchemy.select(AuditEvent)).one()
    assert (audit.actor_type, audit.actor_id) == ("operator", getpass.getuser())
    assert audit.action == "recognition.replayed"
    assert audit.detail["reason"] == "service fixed"
    assert outbox_messages(stub_broker) == 1
    assert "outbox publisher nudged" in result.output


def test_replay_by_status_respects_the_limit(db, stub_broker):
    oldest = add_job(db, status="timeout", finished_ago=timedelta(minutes=10))
    newer = add_job(db, status="timeout", finished_ago=timedelta(minutes=1))
    add_job(db, status="error")

    result = invoke("replay", "--status", "timeout", "--limit", "1")

    assert result.exit_code == 0, result.output
    assert f"replayed job {oldest.id} (timeout)" in result.output
    assert str(newer.id) not in result.output
    assert f"1 job(s) queued by {getpass.getuser()}" in result.output
    queued = db.scalars(
        sqlalchemy.select(RecognitionJob).where(RecognitionJob.status == "queued")
    ).all()
    assert [j.file_id for j in queued] == [oldest.file_id]
    assert outbox_messages(stub_broker) == 1


def test_replay_by_status_with_nothing_to_do(db, stub_broker):
    add_job(db, status="done", file_status="RECOGNIZED")

    result = invoke("replay", "--status", "error")

    assert result.exit_code == 0, result.output
    assert "no current error jobs to replay" in result.output
    assert outbox_messages(stub_broker) == 0


def test_replay_of_a_job_that_did_not_fail_is_refused(db, stub_broker):
    done = add_job(db, status="done", file_status="RECOGNIZED")

    result = invoke("replay", "--job", str(done.id))

    assert result.exit_code == 1
    assert "not replayed" in result.output
    assert db.scalar(sqlalchemy.select(sqlalchemy.func.count()).select_from(RecognitionJob)) == 1
    assert outbox_messages(stub_broker) == 0


def test_replay_of_an_unknown_job_is_refused(db, stub_broker):
    result = invoke("replay", "--job", str(uuid.uuid4()))

    assert result.exit_code == 1
    assert "does not exist" in result.output


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--job", "3f0c6b5e-2a55-4d8a-9a63-5d4f1c0b9e21", "--status", "dlq"],
        ["--job", "not-a-uuid"],
        ["--status", "done"],
        ["--status", "dlq", "--limit", "0"],
    ],
    ids=["neither", "both", "bad-job-id", "status-not-replayable", "limit-zero"],
)
def test_replay_usage_errors(db, stub_broker, args):
    result = invoke("replay", *args)

    assert result.exit_code == 2, result.output
    assert outbox_messages(stub_broker) == 0
