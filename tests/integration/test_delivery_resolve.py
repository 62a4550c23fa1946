"""``mailroom delivery resolve``: an uncertain message settled as its receiver says, once."""

from __future__ import annotations

import psycopg
import pytest
from typer.testing import CliRunner

from mailroom.cli import app
from mailroom.db.engine import libpq_dsn

pytestmark = pytest.mark.integration


def test_an_uncertain_message_is_resolved_once_and_others_are_refused(monkeypatch, database_url):
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    with psycopg.connect(libpq_dsn(database_url), autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO channel_message (channel, recipient, body, status) "
            "VALUES ('email', 'ops@bank.example', 'x', 'uncertain') RETURNING id"
        ).fetchone()
    message_id = row[0]
    runner = CliRunner()

    done = runner.invoke(app, ["delivery", "resolve", "--id", str(message_id), "--as", "failed"])
    assert done.exit_code == 0, done.output
    assert done.output.strip().splitlines()[-1] == f"message {message_id} resolved as failed"
    again = runner.invoke(app, ["delivery", "resolve", "--id", str(message_id), "--as", "failed"])
    assert again.exit_code == 1
    assert f"error: message {message_id} is failed, not uncertain" in again.output

    with psycopg.connect(libpq_dsn(database_url)) as conn:
        found = conn.execute(
            "SELECT status, last_error FROM channel_message WHERE id = %s", (message_id,)
        ).fetchone()
    assert found == ("failed", "resolved by an operator: the receiver did not get it")
