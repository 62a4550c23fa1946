"""Operator commands that write say what they did: `mailroom notify` with Redis down, twice with
one key, with a bad account; `mailroom delivery replay` with Redis down replays nothing."""

from __future__ import annotations

import psycopg
import pytest
from typer.testing import CliRunner

from mailroom.cli import app
from mailroom.cli.errors import describe
from mailroom.db.engine import libpq_dsn
from mailroom.devtools.stack import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def environment(database_url, redis_url, monkeypatch) -> str:
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("MAILROOM_REDIS__URL", redis_url)
    monkeypatch.setenv("MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS", '["hooks.test"]')
    monkeypatch.setenv("MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS__ERP__URL", "https://hooks.test/")
    return database_url


def _messages(database_url: str) -> list[tuple]:
    with psycopg.connect(libpq_dsn(database_url), autocommit=True) as conn:
        return conn.execute(
            "SELECT id, account, enqueued_at IS NOT NULL FROM channel_message ORDER BY id"
        ).fetchall()


def _notify(*args: str):
    return CliRunner().invoke(app, ["notify", "Invoice 42 is late", "--to", "ops", *args])


def test_with_redis_down_the_message_is_stored_and_the_command_says_it_will_be_sent(
    environment, monkeypatch
):
    monkeypatch.setenv("MAILROOM_REDIS__URL", f"redis://127.0.0.1:{free_port()}/0")
    result = _notify("--channel", "log")
    assert result.exit_code == 0, result.output
    [(message_id, account, enqueued)] = _messages(environment)
    assert (account, enqueued) == ("default", False)
    assert result.stdout.startswith(
        f"stored as message {message_id}; it will be sent when Redis is reachable"
    )


def test_a_repeated_command_with_one_idempotency_key_stores_one_message(environment):
    first = _notify("--channel", "webhook", "--account", "erp", "--idempotency-key", "inv-42")
    assert first.exit_code == 0, first.output
    [(message_id, account, enqueued)] = _messages(environment)
    assert (account, enqueued) == ("erp", True)
    assert first.stdout == f"stored as message {message_id} and queued: webhook/erp to ops\n"
    again = _notify("--channel", "webhook", "--account", "erp", "--idempotency-key", "inv-42")
    assert again.exit_code == 0, again.output
    assert f"message {message_id} was stored with idempotency key 'inv-42'" in again.stdout
    assert "nothing stored or sent again" in again.stdout
    assert len(_messages(environment)) == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "webhook needs an account (configured: erp)"),
        (("--account", "default"), "no webhook account 'default' (configured: erp)"),
    ],
)
def test_a_missing_or_unknown_account_is_refused_before_anything_is_stored(environment, args, said):
    result = _notify("--channel", "webhook", *args)
    assert result.exit_code == 2
    assert said in result.output
    assert _messages(environment) == []


def test_replay_with_redis_down_replays_nothing_and_says_redis_is_unreachable(
    environment, monkeypatch
):
    with psycopg.connect(libpq_dsn(environment), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO channel_message (channel, account, recipient, body, status) "
            "VALUES ('log', 'default', 'ops', 'x', 'failed')"
        )
    monkeypatch.setenv("MAILROOM_REDIS__URL", f"redis://127.0.0.1:{free_port()}/0")
    result = CliRunner().invoke(app, ["delivery", "replay", "--status", "failed"])
    failure = describe(result.exception)  # what `mailroom` prints in place of the traceback
    assert failure is not None and failure.exit_code == 1
    assert failure.lines[0].startswith("mailroom: cannot reach Redis")
    with psycopg.connect(libpq_dsn(environment), autocommit=True) as conn:
        assert conn.execute("SELECT status FROM channel_message").fetchall() == [("failed",)]
