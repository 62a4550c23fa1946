"""A webhook URL's credentials are secrets: encrypted in the table, masked in every view and
never in an audit row, while the deliverer still reads the whole URL. Real Postgres, real CLI."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest
from cryptography.fernet import Fernet
from typer.testing import CliRunner

from mailroom.cli import app
from mailroom.config_store import effective
from mailroom.config_store.secrets import Cipher
from mailroom.db.engine import create_engine, create_sessionmaker, libpq_dsn
from mailroom.settings import DatabaseSettings, DeliverySettings

pytestmark = pytest.mark.integration

runner = CliRunner()
KEY = Fernet.generate_key().decode()
PASSWORD, TOKEN = "Url-Password-5521", "Url-Token-9034"
URL = f"https://hook-user:{PASSWORD}@hooks.example.com/in?token={TOKEN}&tenant=acme"
MASKED = "https://hook-user:***@hooks.example.com/in?token=***&tenant=acme"


@pytest.fixture
def env(database_url, monkeypatch, tmp_path):
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("MAILROOM_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("MAILROOM_RUNTIME_CONFIG__KEY", KEY)
    monkeypatch.setenv("MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS", '["hooks.example.com"]')
    return database_url


def _invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_webhook_url_credentials_are_encrypted_masked_and_kept_out_of_the_audit(env):
    _invoke("accounts", "add", "webhook:erp", "--config", json.dumps({"url": URL}))
    _invoke("accounts", "add", "webhook:erp", "--replace", "--config", json.dumps({"url": URL}))

    with psycopg.connect(libpq_dsn(env), autocommit=True) as conn:
        (stored,) = conn.execute(
            "SELECT config FROM runtime_config WHERE kind = 'account' AND name = 'webhook:erp'"
        ).fetchone()
        audit = conn.execute(
            "SELECT action, detail FROM audit_event WHERE target = 'account:webhook:erp'"
        ).fetchall()
    at_rest = json.dumps(stored)
    assert PASSWORD not in at_rest and TOKEN not in at_rest
    assert stored["url"]["shown"] == MASKED
    assert [action for action, _ in audit] == ["runtime_config.add", "runtime_config.replace"]
    for _, detail in audit:
        assert detail["config"]["url"] == MASKED
        assert PASSWORD not in json.dumps(detail) and TOKEN not in json.dumps(detail)

    for command in ("show", "list"):
        output = _invoke("accounts", command, *(["webhook:erp"] if command == "show" else []))
        assert PASSWORD not in output and TOKEN not in output
        assert "hook-user:***@hooks.example.com" in output.replace("\n", "")

    async def read():
        engine = create_engine(DatabaseSettings(url=env))
        try:
            async with create_sessionmaker(engine)() as session:
                delivery = DeliverySettings(webhook_allowed_hosts=["hooks.example.com"])
                return await effective.accounts(session, delivery, Cipher(KEY))
        finally:
            await engine.dispose()

    # The deliverer reads the URL whole: its user info and token are what the receiver checks.
    assert asyncio.run(read()).settings.webhook_accounts["erp"].url == URL


def test_without_a_key_a_webhook_url_with_credentials_is_refused_not_stored_in_clear(
    env, monkeypatch
):
    monkeypatch.delenv("MAILROOM_RUNTIME_CONFIG__KEY")
    result = runner.invoke(
        app, ["accounts", "add", "webhook:erp", "--config", json.dumps({"url": URL})]
    )
    assert result.exit_code != 0
    assert "runtime_config.key is not set" in result.output
    assert PASSWORD not in result.output and TOKEN not in result.output
