"""`mailroom review …` against a real database (typer's CliRunner)."""

from __future__ import annotations

import getpass
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from actors import queues
from mailroom.cli import app
from mailroom.db.engine import libpq_dsn
from mailroom.db.models import (
    AuditEvent,
    Document,
    InboundMail,
    MailboxCursor,
    RecognitionJob,
    StoredFile,
    StoredObject,
)

pytestmark = pytest.mark.integration

runner = CliRunner()

#: A fund type with a one-of rule, as an operator would configure it.
FUND_TYPES = '{"fund": {"required": [["investor_name", "customer_id"], "amount"]}}'


@pytest.fixture
def db(database_url, monkeypatch):
    """A sync session on the test database, which the CLI reads from the environment."""
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("MAILROOM_RECOGNITION__DOCUMENT_TYPES", FUND_TYPES)
    engine = sqlalchemy.create_engine(database_url)
    with Session(engine, expire_on_commit=False) as session:
        yield session
    engine.dispose()


def add_file(
    session: Session,
    *,
    status: str = "NEEDS_CHECK",
    mailbox: str = "billing",
    name: str = "fund-statement-with-a-rather-long-name.csv",
    fields: dict | None = None,
    error_code: str | None = None,
) -> StoredFile:
    """A final mail with one file whose mapped attempt left it in ``status``."""
    cursor = session.query(MailboxCursor).filter_by(mailbox=mailbox).one_or_none()
    if cursor is None:
        cursor = MailboxCursor(mailbox=mailbox, folder="INBOX")
        session.add(cursor)
        session.flush()
    now = datetime.now(UTC)
    mail = InboundMail(
        cursor_id=cursor.id,
        uidvalidity=1,
        uid=session.query(InboundMail).count() + 1,
        subject="Statement",
        status="final",
        finalized_at=now,
        notified_at=now,
    )
    source = StoredObject(
        bucket_role="incoming",
        bucket="mailroom-incoming",
        key=f"files/{uuid.uuid4().hex}",
        created_by="test",
    )
    session.add_all([mail, source])
    session.flush()
    file = StoredFile(
        mail_id=mail.id,
        object_id=source.id,
        original_name=name,
        file_type="csv",
        status=status,
        status_reason=f"{error_code}: broken" if error_code else "check",
    )
    session.add(file)
    session.flush()
    job = RecognitionJob(
        id=uuid.uuid4(),
        file_id=file.id,
        pipeline="tabular",
        status="error" if error_code else "done",
        attempt=1,
        error_code=error_code,
        finished_at=now,
        mapped_at=now,
        service_name="reader",
    )
    session.add(job)
    session.flush()
    if fields is not None:
        session.add(
            Document(
                file_id=file.id,
                job_id=job.id,
                document_type="fund",
                fields={name: value for name, (value, _) in fields.items()},
                field_confidence={name: conf for name, (_, conf) in fields.items()},
                missing_fields=["investor_name|customer_id"],
                low_confidence_fields=sorted(n for n, (_, c) in fields.items() if c < 0.8),
                status="needs_check",
            )
        )
    file.current_recognition_job_id = job.id
    session.commit()
    return file


def review(*args: str):
    return runner.invoke(app, ["review", *args])


def test_list_shows_reasons_readable_at_80_columns_with_filters_and_limit(db, stub_broker):
    checked = add_file(db, fields={"amount": (500, 0.99), "note": ("", 0.2)})
    failed = add_file(db, status="ERROR", mailbox="funds", error_code="PARSE_FAILED")

    result = review("list")

    assert result.exit_code == 0, result.output
    assert max(map(len, result.output.splitlines())) <= 80
    text = " ".join(result.output.split())
    for expected in (
        "NEEDS_CHECK",
        "investor_name|customer_id",
        "low confidence: note",
        "unrecognized: note",
        "ERROR",
        "PARSE_FAILED",
    ):
        assert expected.replace(" ", "") in text.replace(" ", ""), expected
    only_funds = review("list", "--mailbox", "funds")
    assert f"{failed.id} " in only_funds.output and "NEEDS_CHECK" not in only_funds.output
    only_checks = review("list", "--status", "NEEDS_CHECK")
    assert f"{checked.id} " in only_checks.output and "PARSE_FAILED" not in only_checks.output
    limited = review("list", "--limit", "1")
    assert "more files wait; raise --limit (now 1)" in limited.output
    assert "PARSE_FAILED" not in limited.output


def test_show_gives_type_rules_fields_source_object_and_attempts(db, stub_broker):
    file = add_file(db, fields={"amount": (500, 0.99), "customer_id": ("C", 0.4)})
    key = db.get(StoredObject, file.object_id).key

    result = review("show", str(file.id))

    assert result.exit_code == 0, result.output
    out = result.output
    assert "type fund" in out and "required: investor_name|customer_id, amount" in out
    assert "low confidence: customer_id" in out
    assert f"s3://mailroom-incoming/{key}" in out
    assert "0.40" in out and "500" in out
    assert "automatic" in out and "reader" in out
    assert max(map(len, out.splitlines())) <= 80 or key in out  # only the key may run over


def test_correct_records_the_operator_and_nudges_the_notifier(db, stub_broker):
    file = add_file(db, fields={"amount": (500, 0.99)})

    result = review(
        "correct",
        str(file.id),
        "--field",
        "customer_id=C-9",
        "--field",
        "amount=510",
        "--operator",
        "alice",
    )

    assert result.exit_code == 0, result.output
    assert f"file {file.id} corrected by alice: RECOGNIZED (attempt 2" in result.output
    assert "final again" in result.output
    assert stub_broker.queues[queues.MAPPING].qsize() == 1
    db.expire_all()
    manual = db.query(RecognitionJob).filter_by(file_id=file.id, kind="manual").one()
    assert manual.operator_id == "alice"
    document = db.query(Document).filter_by(job_id=manual.id).one()
    assert document.fields == {"amount": 510, "customer_id": "C-9"}
    event = db.query(AuditEvent).filter_by(action="review.corrected").one()
    assert event.detail["changes"]["amount"] == {"from": 500, "to": 510}
    shown = review("show", str(file.id))
    assert "manual" in shown.output and "alice" in shown.output


def test_accept_defaults_to_the_os_user_and_rerun_nudges_the_publisher(db, stub_broker):
    accepted = add_file(db, fields={"amount": (500, 0.99)})
    failed = add_file(db, status="ERROR", error_code="PARSE_FAILED")

    assert review("accept", str(accepted.id)).exit_code == 0
    rerun = review("rerun", str(failed.id), "--reason", "parser fixed")

    assert rerun.exit_code == 0, rerun.output
    assert f"file {failed.id}: attempt 2 queued" in rerun.output
    assert stub_broker.queues[queues.OUTBOX].qsize() == 1
    db.expire_all()
    event = db.query(AuditEvent).filter_by(action="review.accepted").one()
    assert event.actor_id == getpass.getuser()
    assert db.get(StoredFile, failed.id).status == "UPLOADED"


def test_file_held_by_another_session_is_a_conflict_and_nothing_changes(
    db, stub_broker, database_url
):
    file = add_file(db, fields={"amount": (500, 0.99)})
    with psycopg.connect(libpq_dsn(database_url)) as other:
        other.execute("SELECT id FROM stored_file WHERE id = %s FOR UPDATE", (file.id,))
        result = review("accept", str(file.id), "--operator", "bob")

    assert result.exit_code == 1
    assert f"conflict: file {file.id} is being changed right now" in result.output
    db.expire_all()
    assert db.get(StoredFile, file.id).status == "NEEDS_CHECK"
    assert db.query(RecognitionJob).filter_by(kind="manual").count() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["correct", "1", "--field", "no-equals-sign"], "is not name=value"),
        (["correct", "1"], "nothing to correct"),
        (["show", "999"], "file 999 does not exist"),
        (["accept", "999"], "file 999 does not exist"),
    ],
)
def test_usage_errors_and_unknown_files_are_one_line(db, stub_broker, args, message):
    result = review(*args)
    assert result.exit_code != 0
    assert message in result.output
