"""Status for operators on real servers: what needs a person (current attempts only), the
oldest item per stage, JetStream, the object store, the stream on its own Redis, the stuck
files and messages with their reasons, all readable at 80 columns."""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import psycopg
import pytest
import redis
from typer.testing import CliRunner

from mailroom.adapters.nats import NatsClient
from mailroom.adapters.nats.publisher import OutgoingMessage
from mailroom.cli import app
from mailroom.db.engine import libpq_dsn
from mailroom.devtools import docs_examples
from mailroom.devtools.stack import free_port
from mailroom.settings import NatsSettings

pytestmark = pytest.mark.integration

DLQ_JOB = uuid.UUID("00000000-0000-4000-8000-00000000d1a0")
OLD_ERROR_JOB = uuid.UUID("00000000-0000-4000-8000-0000000e5501")

SEED = f"""
INSERT INTO mailbox_cursor (id, mailbox, folder, status, blocked_uid, last_error)
VALUES (1, 'billing', 'INBOX', 'blocked', 42, 'parse error');
INSERT INTO inbound_mail (id, cursor_id, uidvalidity, uid, status, created_at)
VALUES (1, 1, 1, 1, 'received', now() - interval '1 hour');
INSERT INTO inbound_mail (id, cursor_id, uidvalidity, uid, status, finalized_at)
VALUES (2, 1, 1, 2, 'final', now() - interval '2 hours');
INSERT INTO stored_file (id, mail_id, original_name, file_type, status)
VALUES (10, 2, 'a.csv', 'tabular', 'ERROR'), (11, 2, 'b.csv', 'tabular', 'NEEDS_CHECK'),
       (12, 2, 'c.csv', 'tabular', 'PROCESSING');
INSERT INTO recognition_job (id, file_id, pipeline, status, attempt, error_code, error_message,
                             requested_at, finished_at)
VALUES ('{OLD_ERROR_JOB}', 10, 'tabular', 'error', 1, 'BROKEN', 'first try', now(), now()),
       ('{DLQ_JOB}', 10, 'tabular', 'dlq', 2, 'NO_ACK', 'no service acknowledged', now(), now()),
       ('00000000-0000-4000-8000-0000000000b1', 11, 'tabular', 'needs_check', 1,
        NULL, NULL, now(), now());
INSERT INTO recognition_job (id, file_id, pipeline, status, attempt, requested_at,
                             published_at, reply_deadline)
VALUES ('00000000-0000-4000-8000-0000000000c1', 12, 'tabular', 'published', 1,
        now() - interval '30 minutes', now() - interval '30 minutes', now() + interval '1 hour');
UPDATE stored_file SET current_recognition_job_id = '{DLQ_JOB}' WHERE id = 10;
UPDATE stored_file SET status_reason = 'missing: amount',
       current_recognition_job_id = '00000000-0000-4000-8000-0000000000b1' WHERE id = 11;
UPDATE stored_file SET current_recognition_job_id = '00000000-0000-4000-8000-0000000000c1'
 WHERE id = 12;
INSERT INTO channel_message (id, channel, recipient, body, status, attempts, last_error)
VALUES (7, 'webhook', 'ops', 'x', 'uncertain', 1, 'connection reset after the request'),
       (8, 'log', 'ops', 'y', 'failed', 8, 'HTTP 500 from the receiver');
INSERT INTO channel_message (id, channel, recipient, body, status, created_at)
VALUES (9, 'log', 'ops', 'z', 'pending', now() - interval '5 minutes');
"""


@pytest.fixture
def seeded(database_url, redis_url, monkeypatch) -> str:
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("MAILROOM_REDIS__URL", redis_url)
    monkeypatch.setenv("COLUMNS", "80")
    with psycopg.connect(libpq_dsn(database_url), autocommit=True) as conn:
        conn.execute(SEED)
    return database_url


def _json_status() -> dict:
    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _fits_80(output: str) -> str:
    """The output's words on one line, once no line is wider than 80 columns."""
    too_wide = [line for line in output.splitlines() if len(line) > 80]
    assert not too_wide, too_wide
    return " ".join(output.split())


async def _stream_with_consumer(settings: NatsSettings, messages: int) -> None:
    client = NatsClient(settings)
    await client.connect()
    try:
        subscription = await client.subscribe_results()
        for n in range(messages):
            subject = settings.subject(settings.results_subject)
            await client.publish(OutgoingMessage(subject, b"{}", f"m{n}"))
        # Two taken and not acked: ack pending.
        await subscription.fetch(2, 2.0)
        await subscription.close()
    finally:
        await client.close()


def test_status_counts_current_work_and_shows_jetstream_and_store_at_80_columns(
    seeded, nats_url, subject_prefix, s3_endpoint, monkeypatch
):
    stream_name = f"S{subject_prefix.rstrip('.').upper()}"
    nats = NatsSettings(
        url=nats_url, allow_anonymous=True, stream_name=stream_name, subject_prefix=subject_prefix
    )
    asyncio.run(_stream_with_consumer(nats, messages=3))
    for name, value in {
        "NATS__URL": nats_url,
        "NATS__ALLOW_ANONYMOUS": "true",
        "NATS__STREAM_NAME": stream_name,
        "NATS__SUBJECT_PREFIX": subject_prefix,
        "STORAGE__KIND": "s3",
        "STORAGE__S3_ENDPOINT_URL": s3_endpoint,
        "STORAGE__S3_ACCESS_KEY": "test",
        "STORAGE__S3_SECRET_KEY": "test",
    }.items():
        monkeypatch.setenv(f"MAILROOM_{name}", value)

    report = _json_status()
    stopped = report["stopped"]
    # The superseded 'error' attempt of file 10 needs nobody: only its current dlq job counts.
    assert stopped["jobs_dlq"] == 1 and stopped["jobs_error"] == 0
    assert stopped["files_error"] == 1 and stopped["files_needs_check"] == 1
    assert stopped["messages_uncertain"] == 1 and stopped["messages_failed"] == 1
    assert stopped["cursors_blocked"] == 1
    oldest = report["oldest_s"]
    assert 3500 < oldest["intake"] < 4000
    assert 1700 < oldest["recognition"] < 2000
    assert 7100 < oldest["notification"] < 7600
    assert 250 < oldest["delivery"] < 400
    jetstream = report["jetstream"]
    assert jetstream["stream"]["messages"] == 3
    assert jetstream["consumer"]["ack_pending"] == 2
    assert jetstream["consumer"]["pending"] == 1
    assert report["object_store"]["reachable"] is True

    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    out = _fits_80(result.stdout)
    assert f"JetStream stream {stream_name}: 3 messages" in out
    assert "1 pending, 2 ack pending, 0 redelivered" in out
    assert "reachable" in out
    assert "recognition" in out and "30m" in out
    assert "{" not in out  # no raw Python dict


def test_status_says_when_jetstream_and_the_object_store_are_unreachable(seeded, monkeypatch):
    closed = free_port()
    for name, value in {
        "NATS__URL": f"nats://127.0.0.1:{closed}",
        "NATS__ALLOW_ANONYMOUS": "true",
        "NATS__CONNECT_TIMEOUT_S": "0.5",
        "STORAGE__KIND": "s3",
        "STORAGE__S3_ENDPOINT_URL": f"http://127.0.0.1:{closed}",
        "STORAGE__S3_RETRIES": "0",
        "STORAGE__S3_CONNECT_TIMEOUT_S": "0.5",
    }.items():
        monkeypatch.setenv(f"MAILROOM_{name}", value)
    report = _json_status()
    assert report["object_store"]["reachable"] is False
    assert "error" in report["jetstream"]
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    out = _fits_80(result.stdout)
    assert "unreachable" in out


def test_status_masks_the_credentials_of_every_url_it_names(seeded, monkeypatch):
    closed = free_port()
    secret = "Status-Url-Secret-31"
    for name, value in {
        "NATS__URL": f"nats://{secret}@127.0.0.1:{closed}",
        "NATS__CONNECT_TIMEOUT_S": "0.5",
        "STORAGE__KIND": "s3",
        "STORAGE__S3_ENDPOINT_URL": f"http://s3-user:{secret}@127.0.0.1:{closed}/?token={secret}",
        "STORAGE__S3_RETRIES": "0",
        "STORAGE__S3_CONNECT_TIMEOUT_S": "0.5",
    }.items():
        monkeypatch.setenv(f"MAILROOM_{name}", value)
    report = _json_status()
    assert report["object_store"]["where"] == f"http://s3-user:***@127.0.0.1:{closed}/?token=***"
    assert f"nats://***@127.0.0.1:{closed}" in report["jetstream"]["error"]
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    assert secret not in json.dumps(report) and secret not in result.output


def test_status_reads_the_delivery_stream_from_its_own_redis(seeded, redis_url, monkeypatch):
    stream_url = redis_url.rsplit("/", 1)[0] + "/3"
    monkeypatch.setenv("MAILROOM_DELIVERY__REDIS_URL", stream_url)
    client = redis.Redis.from_url(stream_url)
    try:
        client.xadd("mailroom:delivery-stream", {"payload": "1"})
        client.xadd("mailroom:delivery-stream", {"payload": "2"})
        report = _json_status()
        assert report["stream"]["length"] == 2
        assert report["queues"]  # Dramatiq's queues still on the broker's Redis
    finally:
        client.flushdb()
        client.close()


def _same_ages(in_docs: str, shown: str) -> bool:
    """Equal but for the ages, which move with the clock while the test runs."""

    def ageless(text: str) -> str:
        return re.sub(r"\d+m \d+s", "…", text)

    return ageless(in_docs) == ageless(shown)


def test_recognition_status_lists_current_stuck_files_with_reasons(seeded):
    result = CliRunner().invoke(app, ["recognition", "status", "--limit", "5"])
    assert result.exit_code == 0, result.output
    out = _fits_80(result.stdout)
    assert str(DLQ_JOB) in out
    assert "NO_ACK" in out
    assert "missing:" in out and "amount" in out
    assert str(OLD_ERROR_JOB) not in out  # superseded
    assert "(2 of 2" in out

    # The operating guide shows this listing and the replay it leads to.
    listing = "\n".join(line.rstrip() for line in result.stdout.rstrip().splitlines())
    shown = f"$ mailroom recognition status --limit 5\n{listing}\n"
    shown += f"$ mailroom recognition replay --job {DLQ_JOB}"
    docs_examples.check_example("recognition-status", shown, language="console", same=_same_ages)

    limited = CliRunner().invoke(app, ["recognition", "status", "--limit", "1"])
    assert "(1 of 2" in _fits_80(limited.stdout)


def test_delivery_status_lists_failed_and_uncertain_messages_with_reasons(seeded):
    result = CliRunner().invoke(app, ["delivery", "status", "--limit", "5"])
    assert result.exit_code == 0, result.output
    out = _fits_80(result.stdout)
    assert "HTTP 500 from the receiver" in out
    assert "connection reset" in out
    assert "(2 of 2" in out


def test_notify_without_a_subject_sends_the_first_line_as_subject(seeded):
    result = CliRunner().invoke(
        app, ["notify", "Invoice 42 is late\nDetails follow.", "--channel", "log", "--to", "ops"]
    )
    assert result.exit_code == 0, result.output
    with psycopg.connect(libpq_dsn(seeded), autocommit=True) as conn:
        row = conn.execute(
            "SELECT subject FROM channel_message WHERE recipient = 'ops' AND body LIKE 'Invoice%'"
        ).fetchone()
    assert row == ("Invoice 42 is late",)


def test_a_filesystem_store_not_created_yet_is_reachable_and_said_so(seeded, tmp_path, monkeypatch):
    monkeypatch.setenv("MAILROOM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MAILROOM_NATS__JETSTREAM", "false")
    store = _json_status()["object_store"]
    assert store["reachable"] is True and "not created yet" in store["note"]
    (tmp_path / "state" / "objects").mkdir(parents=True)
    assert "note" not in _json_status()["object_store"]


def test_files_of_a_type_no_service_declares_wait_and_status_says_so(
    seeded, nats_url, tmp_path, monkeypatch
):
    with psycopg.connect(libpq_dsn(seeded), autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO stored_file (id, mail_id, original_name, file_type, status)
            VALUES (20, 2, 'sheet.xlsx', 'xlsx', 'UPLOADED');
            INSERT INTO recognition_job (id, file_id, pipeline, status, attempt)
            VALUES ('00000000-0000-4000-8000-0000000000e1', 20, 'tabular', 'queued', 1);
            UPDATE stored_file SET current_recognition_job_id = '00000000-0000-4000-8000-0000000000e1'
             WHERE id = 20;
            """
        )
    monkeypatch.setenv("MAILROOM_NATS__URL", nats_url)
    monkeypatch.setenv("MAILROOM_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("MAILROOM_RECOGNITION__FILE_TYPES", '{"tabular": ["csv"], "image": ["*"]}')

    report = _json_status()

    assert report["undeclared_types"] == [{"pipeline": "tabular", "file_type": "xlsx", "files": 1}]
    result = CliRunner().invoke(app, ["status"])
    out = _fits_80(result.stdout)
    assert "1 tabular file(s) of type xlsx wait: no recognition service declares it" in out
