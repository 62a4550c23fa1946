"""Settings read the environment with the MAILROOM_ prefix and nested ``__``."""

from __future__ import annotations

from mailroom.settings import Settings


def test_defaults_point_at_the_embedded_dev_stack(monkeypatch):
    monkeypatch.delenv("MAILROOM_BROKER__KIND", raising=False)  # set to "stub" by conftest
    settings = Settings()
    assert settings.database.url.startswith("postgresql+psycopg://postgres@127.0.0.1:")
    assert settings.redis.url.startswith("redis://127.0.0.1:")
    assert settings.broker.kind == "redis"


def test_nested_values_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABASE__URL", "postgresql+psycopg://u@db.internal/x")
    monkeypatch.setenv("MAILROOM_INTAKE__LEASE_S", "12.5")
    monkeypatch.setenv("MAILROOM_BROKER__KIND", "stub")
    monkeypatch.setenv(
        "MAILROOM_INTAKE__MAILBOXES",
        '[{"name": "billing", "host": "imap.internal", "password": "s3cret"}]',
    )
    settings = Settings()
    assert settings.database.url == "postgresql+psycopg://u@db.internal/x"
    assert settings.intake.lease_s == 12.5
    assert settings.broker.kind == "stub"
    (mailbox,) = settings.intake.mailboxes
    assert mailbox.name == "billing"
    assert mailbox.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
