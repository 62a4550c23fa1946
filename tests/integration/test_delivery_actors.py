"""Delivery actors on the StubBroker with real Postgres, Redis and HTTP; the CLI commands."""

from __future__ import annotations

import psycopg
import pytest
import typer
from typer.testing import CliRunner

from actors.delivery import (
    deliver_channel_message,
    deliver_channel_messages,
    readd_pending_deliveries,
    recover_stale_deliveries,
)
from actors.middleware import resources
from mailroom.cli import app as mailroom_app
from mailroom.cli.delivery import notify
from mailroom.db.audit import operator_id
from mailroom.settings import DatabaseSettings, RedisSettings, Settings, WebhookAccount
from tests.fixtures.delivery import HttpReply, load_message, make_message

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(database_url, redis_url, delivery_settings, http_receiver):
    delivery = delivery_settings.model_copy(
        update={"webhook_accounts": {"default": WebhookAccount(url=http_receiver.url)}}
    )
    return Settings(
        database=DatabaseSettings(url=database_url),
        redis=RedisSettings(url=redis_url),
        delivery=delivery,
    )


@pytest.fixture
def configured(settings):
    resources.configure(settings)
    return settings


def drain(broker, worker, queue: str) -> None:
    broker.join(queue, fail_fast=True)
    worker.join()


async def test_actor_delivers_and_dramatiq_retries_with_the_delivery_delay(
    configured, stub_broker, stub_worker, delivery_sessions, http_receiver
):
    http_receiver.reply(HttpReply(503), HttpReply(429, {"Retry-After": "0"}))
    message_id = await make_message(delivery_sessions, channel="webhook")
    deliver_channel_message.send(message_id)
    drain(stub_broker, stub_worker, deliver_channel_message.queue_name)
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts) == ("delivered", 3)
    assert [r.headers["Idempotency-Key"] for r in http_receiver.requests] == [f"{message_id}:1"] * 3
    assert stub_broker.dead_letters == []


async def test_actor_gives_up_at_the_maximum_of_attempts(
    configured, stub_broker, stub_worker, delivery_sessions, http_receiver
):
    attempts = configured.delivery.max_attempts
    http_receiver.reply(*[HttpReply(500)] * attempts)
    message_id = await make_message(delivery_sessions, channel="webhook")
    deliver_channel_message.send(message_id)
    drain(stub_broker, stub_worker, deliver_channel_message.queue_name)
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts) == ("failed", attempts)
    assert len(http_receiver.requests) == attempts


async def test_batch_actor_delivers_and_retries_a_failed_message_on_its_own(
    configured, stub_broker, stub_worker, delivery_sessions, http_receiver
):
    ids = [await make_message(delivery_sessions, channel="webhook") for _ in range(3)]
    http_receiver.reply(HttpReply(503))  # whichever message is sent first fails once
    deliver_channel_messages.send(ids)
    drain(stub_broker, stub_worker, deliver_channel_messages.queue_name)
    rows = [await load_message(delivery_sessions, mid) for mid in ids]
    assert [row.status for row in rows] == ["delivered"] * 3
    assert sorted(row.attempts for row in rows) == [1, 1, 2]
    keys = [r.headers["Idempotency-Key"] for r in http_receiver.requests]
    assert sorted(keys) == sorted([f"{mid}:1" for mid in ids] + [keys[0]])
    assert stub_broker.dead_letters == []


async def test_batch_actor_rejects_a_malformed_payload_without_retrying(
    configured, stub_broker, stub_worker
):
    deliver_channel_messages.send(["x", -1])
    stub_broker.join(deliver_channel_messages.queue_name, fail_fast=False)
    stub_worker.join()
    assert len(stub_broker.dead_letters) == 1


async def test_maintenance_actors_run(configured, stub_broker, stub_worker, delivery_sessions):
    message_id = await make_message(delivery_sessions)
    readd_pending_deliveries.send()
    recover_stale_deliveries.send()
    drain(stub_broker, stub_worker, readd_pending_deliveries.queue_name)
    assert (await load_message(delivery_sessions, message_id)).enqueued_at is not None


def test_cli_notify_status_and_replay(settings, monkeypatch, database_url):
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("MAILROOM_REDIS__URL", settings.redis.url)
    monkeypatch.setenv("MAILROOM_DELIVERY__STREAM_KEY", settings.delivery.stream_key)
    runner = CliRunner()
    notify_app = typer.Typer()
    notify_app.command("notify")(notify)
    notify_app.callback()(lambda: None)

    result = runner.invoke(
        notify_app, ["notify", "--channel", "log", "--to", "ops", "--subject", "Hi", "all good"]
    )
    assert result.exit_code == 0, result.output
    assert "queued" in result.output
    result = runner.invoke(notify_app, ["notify", "--channel", "nope", "--to", "ops", "x"])
    assert result.exit_code != 0

    dsn = database_url.replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE channel_message SET status = 'failed'")
        [(message_id,)] = conn.execute("SELECT id FROM channel_message").fetchall()

    result = runner.invoke(mailroom_app, ["delivery", "status"])
    assert result.exit_code == 0, result.output
    assert "failed" in result.output and "log" in result.output
    assert "length" in result.output

    result = runner.invoke(mailroom_app, ["delivery", "replay"])
    assert result.exit_code != 0
    result = runner.invoke(mailroom_app, ["delivery", "replay", "--status", "failed"])
    assert result.exit_code == 0, result.output
    assert f"replayed 1 message(s): [{message_id}]" in result.output
    result = runner.invoke(mailroom_app, ["delivery", "replay", "--id", str(message_id)])
    assert result.exit_code == 1
    assert "not replayable" in result.output
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT status FROM channel_message").fetchone() == ("pending",)
        actions = conn.execute("SELECT action, actor_type, actor_id FROM audit_event").fetchall()
    assert actions[0] == ("delivery.replayed", "operator", operator_id())
