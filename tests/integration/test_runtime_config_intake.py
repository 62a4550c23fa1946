"""A mailbox added at runtime (``mailroom mailboxes add``) is polled from the next pass."""

from __future__ import annotations

import json

import psycopg
import pytest
from cryptography.fernet import Fernet
from typer.testing import CliRunner

import actors.middleware.resources
from mailroom.cli import app
from mailroom.db.engine import libpq_dsn
from mailroom.settings import (
    DatabaseSettings,
    RedisSettings,
    RuntimeConfigSettings,
    Settings,
    StorageSettings,
)
from scheduling.jobs import job_table
from tests.fixtures.imap import csv_mail

pytestmark = pytest.mark.integration

runner = CliRunner()
KEY = Fernet.generate_key().decode()


@pytest.fixture
def settings(database_url, redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("MAILROOM_RUNTIME_CONFIG__KEY", KEY)
    settings = Settings(
        state_dir=tmp_path,
        database=DatabaseSettings(url=database_url, pool_size=2),
        # The passes' marks (outbox nudge, notifications) live in Redis, as in production.
        redis=RedisSettings(url=redis_url),
        storage=StorageSettings(kind="filesystem"),
        runtime_config=RuntimeConfigSettings(key=KEY),
    )
    actors.middleware.resources.configure(settings)
    return settings


def _query(settings, sql, *params):
    with psycopg.connect(libpq_dsn(settings.database.url), autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _one_scheduler_pass(settings, stub_broker, worker) -> None:
    """What the scheduler does once per poll interval, then the intake queue drained."""
    (job,) = [job for job in job_table(settings) if job.name == "poll_mailboxes"]
    job.send()
    stub_broker.join("intake", fail_fast=True)
    worker.join()


def test_a_mailbox_added_at_runtime_is_polled_at_the_next_pass_and_disabling_stops_it(
    settings, stub_broker, intake_worker, imap_server, imap_folder
):
    (uid,) = imap_server.append(imap_folder, csv_mail(1))
    _one_scheduler_pass(settings, stub_broker, intake_worker)
    assert _query(settings, "SELECT count(*) FROM inbound_mail") == [(0,)], "no mailbox yet"

    mailbox = imap_server.mailbox_settings("runtime", imap_folder)
    config = mailbox.model_dump(mode="json", exclude={"password"})
    added = runner.invoke(
        app,
        ["mailboxes", "add", "runtime", "--config", "-", "--operator", "ops-1"],
        input=json.dumps({**config, "password": mailbox.password.get_secret_value()}),
    )
    assert added.exit_code == 0, added.output
    stored = _query(settings, "SELECT config FROM runtime_config WHERE name = 'runtime'")
    assert mailbox.password.get_secret_value() not in json.dumps(stored), "stored encrypted"
    listed = runner.invoke(app, ["intake", "status"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert f"runtime/{imap_folder}" in listed.output and "not polled yet" in listed.output

    _one_scheduler_pass(settings, stub_broker, intake_worker)
    assert _query(
        settings,
        "SELECT c.mailbox, m.uid FROM inbound_mail m JOIN mailbox_cursor c ON c.id = m.cursor_id",
    ) == [("runtime", uid)]

    disabled = runner.invoke(app, ["mailboxes", "disable", "runtime", "--operator", "ops-1"])
    assert disabled.exit_code == 0, disabled.output
    imap_server.append(imap_folder, csv_mail(2))
    _one_scheduler_pass(settings, stub_broker, intake_worker)
    assert _query(settings, "SELECT count(*) FROM inbound_mail") == [(1,)], "disabled: not polled"

    events = _query(settings, "SELECT actor_id, action, target FROM audit_event ORDER BY id")
    assert events == [
        ("ops-1", "runtime_config.add", "mailbox:runtime"),
        ("ops-1", "runtime_config.disable", "mailbox:runtime"),
    ]
