"""`intake unblock`/`reset` on a mailbox being polled wait for the batch instead of failing;
`intake status` is readable at 80 columns."""

from __future__ import annotations

import psycopg
import pytest
from typer.testing import CliRunner

from mailroom.cli import app
from mailroom.db.engine import libpq_dsn

pytestmark = pytest.mark.integration


@pytest.fixture
def dsn(database_url, monkeypatch) -> str:
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    dsn = libpq_dsn(database_url)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mailbox_cursor (mailbox, folder, status, last_uid, retry_count,"
            " blocked_uid, blocked_message_id, last_error, uidvalidity)"
            " VALUES ('billing-department', 'INBOX', 'blocked', 41, 5, 42, '<bad@x>',"
            " 'ValueError: a long reason why this mail could not be stored at all', 7)"
        )
    return dsn


def _being_polled(dsn: str, *, for_s: float) -> None:
    """A poll holds the cursor's lease for ``for_s`` more seconds, as a batch does."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE mailbox_cursor SET status = 'processing', lease_id = gen_random_uuid(),"
            " lease_until = now() + make_interval(secs => %s)",
            (for_s,),
        )


def _cursor(dsn: str) -> tuple:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status, last_uid, lease_id FROM mailbox_cursor").fetchone()
    assert row is not None
    return row


def test_unblock_on_a_mailbox_being_polled_waits_for_its_batch(dsn):
    _being_polled(dsn, for_s=1.0)
    result = CliRunner().invoke(app, ["intake", "unblock", "billing-department"])
    assert result.exit_code == 0, result.output
    assert "waiting for its batch to end" in result.stderr
    assert "unblocked billing-department/INBOX" in result.stdout
    assert _cursor(dsn) == ("idle", 41, None)


def test_reset_on_a_mailbox_being_polled_waits_then_moves_the_cursor(dsn):
    _being_polled(dsn, for_s=1.0)
    result = CliRunner().invoke(app, ["intake", "reset", "billing-department", "--uid", "50"])
    assert result.exit_code == 0, result.output
    assert "waiting for its batch to end" in result.stderr
    assert _cursor(dsn) == ("idle", 50, None)


def test_a_wait_that_runs_out_refuses_and_changes_nothing(dsn):
    _being_polled(dsn, for_s=60.0)
    result = CliRunner().invoke(
        app, ["intake", "reset", "billing-department", "--uid", "0", "--wait-s", "0"]
    )
    assert result.exit_code == 1
    assert "being polled right now" in result.output
    assert _cursor(dsn)[:2] == ("processing", 41)


def test_intake_status_fits_80_columns_with_readable_headers(dsn):
    result = CliRunner().invoke(app, ["intake", "status"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    header = next(line for line in lines if "mailbox/folder" in line)
    for column in ("status", "last uid", "tries", "until", "stopped at, error"):
        assert column in header
    assert "…" not in header
    flat = " ".join(result.stdout.split())
    assert "UID 42 <bad@x>" in flat
