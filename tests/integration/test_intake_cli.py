"""`mailroom intake status | unblock | reset` against Postgres, audit-logged."""

from __future__ import annotations

import json

import psycopg
import pytest
from typer.testing import CliRunner

from mailroom.cli import app

pytestmark = pytest.mark.integration


@pytest.fixture
def dsn(database_url, monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mailbox_cursor (mailbox, folder, status, last_uid, retry_count,"
            " blocked_uid, blocked_message_id, last_error, uidvalidity)"
            " VALUES ('billing', 'INBOX', 'blocked', 41, 5, 42, '<bad@x>', 'ValueError: [boom]', 7)"
        )
    return dsn


def _rows(dsn, sql):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def test_status_shows_cursors_and_configured_mailboxes(dsn, monkeypatch):
    mailbox = {"name": "dev", "host": "imap.test", "username": "u", "password": "p"}
    monkeypatch.setenv("MAILROOM_INTAKE__MAILBOXES", json.dumps([mailbox]))
    result = CliRunner().invoke(app, ["intake", "status"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "billing" in result.output and "blocked" in result.output
    assert "UID 42 <bad@x>" in result.output
    assert "[boom]" in result.output, "untrusted text is escaped, not read as markup"
    assert "not polled yet" in result.output  # the configured "dev" mailbox


def test_unblock_clears_the_block_and_is_audited(dsn):
    result = CliRunner().invoke(app, ["intake", "unblock", "billing"])
    assert result.exit_code == 0, result.output
    assert _rows(dsn, "SELECT status, retry_count, blocked_uid, last_uid FROM mailbox_cursor") == [
        ("idle", 0, None, 41)
    ]
    ((action, detail),) = _rows(dsn, "SELECT action, detail FROM audit_event")
    assert action == "intake.unblocked"
    assert detail["blocked_uid"] == 42 and detail["blocked_message_id"] == "<bad@x>"


def test_reset_moves_the_cursor_and_is_audited(dsn):
    result = CliRunner().invoke(app, ["intake", "reset", "billing", "--uid", "42"])
    assert result.exit_code == 0, result.output
    assert _rows(dsn, "SELECT status, last_uid FROM mailbox_cursor") == [("idle", 42)]
    ((action, detail),) = _rows(dsn, "SELECT action, detail FROM audit_event")
    assert action == "intake.reset"
    assert (detail["old_last_uid"], detail["new_last_uid"]) == (41, 42)


def test_unknown_mailbox_is_a_clear_error(dsn):
    result = CliRunner().invoke(app, ["intake", "unblock", "nope"])
    assert result.exit_code == 1
    assert "no cursor for mailbox 'nope'" in result.output
    assert _rows(dsn, "SELECT count(*) FROM audit_event") == [(0,)]


def test_reset_refuses_a_cursor_that_is_being_polled(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE mailbox_cursor SET status = 'processing', lease_id = gen_random_uuid(),"
            " lease_until = now() + interval '1 minute'"
        )
    result = CliRunner().invoke(app, ["intake", "reset", "billing", "--uid", "0", "--wait-s", "0"])
    assert result.exit_code == 1
    assert "being polled right now" in result.output
    assert _rows(dsn, "SELECT last_uid FROM mailbox_cursor") == [(41,)]
