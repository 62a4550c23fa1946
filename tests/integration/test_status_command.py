"""``mailroom status --json`` reports every store, the stream and the scheduler leader."""

from __future__ import annotations

import json

import psycopg
import pytest
from typer.testing import CliRunner

from mailroom.cli import app
from mailroom.db.engine import libpq_dsn

pytestmark = pytest.mark.integration


def test_status_json_counts_stopped_work_and_queues(database_url, redis_url, monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("MAILROOM_REDIS__URL", redis_url)
    with psycopg.connect(libpq_dsn(database_url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mailbox_cursor (mailbox, folder, status, blocked_uid, last_error) "
            "VALUES ('billing', 'INBOX', 'blocked', 42, 'parse error')"
        )
        conn.execute(
            "INSERT INTO channel_message (channel, recipient, body, status) "
            "VALUES ('log', 'ops', 'x', 'uncertain'), ('log', 'ops', 'y', 'delivered')"
        )
    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert report["cursors"] == {"blocked": 1}
    assert report["blocked_cursors"][0]["uid"] == 42
    assert report["messages"] == {"uncertain": 1, "delivered": 1}
    assert report["stopped"]["messages_uncertain"] == 1
    assert report["stopped"]["cursors_blocked"] == 1
    assert set(report["queues"]) >= {"intake", "outbox", "inbox", "delivery"}
    assert report["stream"]["length"] == 0
    assert report["scheduler_leader"] is None
