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
    assert report["database_in_recovery"] is False
    assert report["redis_links"]["stream"]["role"] == "master"


def test_status_warns_of_the_filesystem_store_when_bridges_run_on_several_hosts(
    database_url, redis_url, monkeypatch, tmp_path
):
    import redis

    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("MAILROOM_REDIS__URL", redis_url)
    monkeypatch.setenv("MAILROOM_STORAGE__ROOT", str(tmp_path / "objects"))
    client = redis.Redis.from_url(redis_url)
    try:  # stream bridges on two hosts, as their consumer names (host-pid) say
        client.xgroup_create("mailroom:delivery-stream", "mailroom-delivery", mkstream=True)
        for name in ("app-1-101", "app-2-202", "app-2-203"):
            client.xgroup_createconsumer("mailroom:delivery-stream", "mailroom-delivery", name)
    finally:
        client.close()
    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert report["stream"]["hosts"] == ["app-1", "app-2"]
    assert report["object_store"]["warning"] == (
        "the filesystem store serves one host, and stream bridges run on 2 (app-1, app-2): "
        "use S3, or a folder every host mounts"
    )
