"""`mailroom mailboxes|accounts|routes` and the seed at migrate, on a real database."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest
from cryptography.fernet import Fernet
from typer.testing import CliRunner

from mailroom.cli import app
from mailroom.config_store import effective
from mailroom.db.engine import create_engine, create_sessionmaker, libpq_dsn
from mailroom.settings import DatabaseSettings, DeliverySettings, NotificationRoute

pytestmark = pytest.mark.integration

runner = CliRunner()
KEY = Fernet.generate_key().decode()
SECRET = "whsec_" + "c2VjcmV0IG9mIHRoZSB3ZWJob29rIHRlc3Rz"


@pytest.fixture
def env(database_url, monkeypatch, tmp_path):
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("MAILROOM_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("MAILROOM_RUNTIME_CONFIG__KEY", KEY)
    monkeypatch.setenv("MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS", '["hooks.example.com"]')
    return database_url


def _invoke(*args: str, input: str | None = None):
    result = runner.invoke(app, list(args), input=input)
    return result.exit_code, result.output


def test_show_masks_secrets_and_list_shows_what_each_row_points_at(env):
    config = json.dumps({"url": "https://hooks.example.com/in", "secrets": [SECRET]})
    code, output = _invoke("accounts", "add", "webhook:erp", "--config", config)
    assert code == 0, output
    code, output = _invoke("accounts", "show", "webhook:erp")
    assert code == 0, output
    assert SECRET not in output and "**********" in output and "hooks.example.com" in output
    code, output = _invoke("accounts", "list")
    assert "webhook:erp" in output and "https://hooks.example.com/in" in output
    assert SECRET not in output

    code, output = _invoke("accounts", "add", "webhook:erp", "--config", config)
    assert code == 1 and "exists already; add --replace" in output
    code, output = _invoke("accounts", "add", "webhook:x", "--set", "url=http://10.1.1.1/")
    assert code == 1 and "webhook:x" in output and output.count("\n") <= 2, output
    code, output = _invoke("accounts", "disable", "webhook:nope")
    assert code == 1 and "no account 'webhook:nope'" in output
    code, output = _invoke("routes", "add", "r", "--set", "channel=webhook", "--set", "account=x")
    assert code == 1 and "no webhook account 'x'; add it first" in output
    code, output = _invoke("routes", "add", "r", "--set", "channel=webhook", "--set", "account=erp")
    assert code == 0, output


def test_migrate_seeds_the_environment_and_leaves_operator_rows_alone(env, monkeypatch):
    routes = [{"channel": "log", "recipient": "first"}, {"channel": "log", "recipient": "b"}]
    monkeypatch.setenv("MAILROOM_DELIVERY__ROUTES", json.dumps(routes))
    code, output = _invoke("migrate")
    assert code == 0 and "seeded from the environment: route settings-1, route settings-2" in output
    assert "buckets ready: mailroom-mail, mailroom-incoming, mailroom-results (created " in output

    code, output = _invoke("routes", "disable", "settings-2", "--operator", "ops-1")
    assert code == 0, output
    routes[0]["recipient"] = "changed"
    routes[1]["recipient"] = "not-applied"
    monkeypatch.setenv("MAILROOM_DELIVERY__ROUTES", json.dumps(routes))
    code, output = _invoke("migrate")
    assert code == 0 and "seeded from the environment: route settings-1\n" in output

    with psycopg.connect(libpq_dsn(env), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, source, enabled, config->>'recipient' FROM runtime_config ORDER BY name"
        ).fetchall()
    assert rows == [
        ("settings-1", "settings", True, "changed"),
        ("settings-2", "operator", False, "b"),
    ]


def test_routes_read_by_notifications_are_the_environments_and_the_operators(env):
    code, output = _invoke(
        "routes", "add", "erp", "--set", "channel=log", "--set", "recipient=erp-team"
    )
    assert code == 0, output
    _invoke("routes", "add", "off", "--set", "recipient=nobody")
    _invoke("routes", "disable", "off")
    delivery = DeliverySettings(routes=[NotificationRoute(recipient="ops")])

    async def read():
        engine = create_engine(DatabaseSettings(url=env))
        try:
            return await effective.delivery_routes(create_sessionmaker(engine), delivery, KEY)
        finally:
            await engine.dispose()

    found = asyncio.run(read()).routes
    assert [route.recipient for route in found] == ["ops", "erp-team"]
