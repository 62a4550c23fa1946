"""Accounts changed with the CLI while a delivery worker runs (StubBroker, real Postgres, Redis, HTTP)."""

from __future__ import annotations

import asyncio

import pytest
from cryptography.fernet import Fernet
from typer.testing import CliRunner

from actors.delivery import deliver_channel_messages
from actors.middleware import resources
from mailroom.cli import app
from mailroom.db.engine import create_engine, create_sessionmaker
from mailroom.settings import DatabaseSettings, RedisSettings, RuntimeConfigSettings, Settings
from tests.fixtures.delivery import load_message, make_message

pytestmark = pytest.mark.integration

runner = CliRunner()
KEY = Fernet.generate_key().decode()


@pytest.fixture
def configured(database_url, redis_url, delivery_settings, monkeypatch):
    for name, value in {
        "MAILROOM_DATABASE__URL": database_url,
        "MAILROOM_RUNTIME_CONFIG__KEY": KEY,
        "MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS": '["127.0.0.1"]',
        "MAILROOM_DELIVERY__WEBHOOK_ALLOW_HTTP": "true",
    }.items():
        monkeypatch.setenv(name, value)
    settings = Settings(
        database=DatabaseSettings(url=database_url),
        redis=RedisSettings(url=redis_url),
        delivery=delivery_settings,
        runtime_config=RuntimeConfigSettings(key=KEY),
    )
    resources.configure(settings)
    return settings


def _db(settings, work):
    async def main():
        engine = create_engine(settings.database)
        try:
            return await work(create_sessionmaker(engine))
        finally:
            await engine.dispose()

    return asyncio.run(main())


def _deliver_one(settings, broker, worker):
    async def new(sessions):
        return await make_message(sessions, channel="webhook", account="ops")

    message_id = _db(settings, new)
    deliver_channel_messages.send([message_id])
    broker.join(deliver_channel_messages.queue_name, fail_fast=True)
    worker.join()

    async def load(sessions):
        return await load_message(sessions, message_id)

    return _db(settings, load)


def _cli(*args: str) -> None:
    result = runner.invoke(app, [*args, "--operator", "ops-1"])
    assert result.exit_code == 0, result.output


def test_the_worker_uses_an_account_added_while_it_runs_and_fails_on_a_disabled_one(
    configured, stub_broker, stub_worker, http_receiver
):
    missing = _deliver_one(configured, stub_broker, stub_worker)
    assert missing.status == "failed" and "no webhook account 'ops'" in missing.last_error

    _cli("accounts", "add", "webhook:ops", "--set", f"url={http_receiver.url}")
    sent = _deliver_one(configured, stub_broker, stub_worker)
    assert sent.status == "delivered"
    assert [r.body["message_id"] for r in http_receiver.requests] == [sent.id]

    _cli("accounts", "disable", "webhook:ops")
    disabled = _deliver_one(configured, stub_broker, stub_worker)
    assert (disabled.status, disabled.attempts) == ("failed", 1)
    assert disabled.last_error.endswith("account 'webhook:ops' is disabled")
    assert len(http_receiver.requests) == 1

    _cli("accounts", "enable", "webhook:ops")
    assert _deliver_one(configured, stub_broker, stub_worker).status == "delivered"
    assert stub_broker.dead_letters == []
