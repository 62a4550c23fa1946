"""Settings read the environment with the MAILROOM_ prefix and nested ``__``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mailroom.settings import EmailAccount, MailboxSettings, Settings


def test_defaults_reach_only_loopback_and_configure_no_mailbox(monkeypatch):
    monkeypatch.delenv("MAILROOM_BROKER__KIND", raising=False)  # set to "stub" by conftest
    settings = Settings()
    assert ":" not in settings.database.url.split("://")[1].split("@")[0]  # no password
    assert "@127.0.0.1:" in settings.database.url
    assert settings.redis.url.startswith("redis://127.0.0.1:")
    assert "@" not in settings.broker.rabbitmq_url
    assert settings.broker.kind == "redis"
    assert settings.intake.mailboxes == []
    assert settings.delivery.email_accounts == {}


def test_mailboxes_and_mail_accounts_use_tls_unless_told_otherwise():
    mailbox = MailboxSettings(name="m", host="imap.corp", username="u", password="p")
    assert (mailbox.security, mailbox.port) == ("ssl", 993)
    starttls = MailboxSettings(name="m", host="h", username="u", password="p", security="starttls")
    assert starttls.port == 143
    account = EmailAccount(host="smtp.corp")
    assert (account.security, account.port) == ("starttls", 587)
    assert EmailAccount(host="smtp.corp", security="ssl").port == 465


def test_plain_text_mail_needs_an_explicit_port():
    with pytest.raises(ValidationError, match="plain"):
        MailboxSettings(name="m", host="h", username="u", password="p", security="plain")
    with pytest.raises(ValidationError, match="plain"):
        EmailAccount(host="h", security="plain")
    assert EmailAccount(host="h", security="plain", port=2525).port == 2525


def test_a_mailbox_has_no_default_server_or_credentials():
    with pytest.raises(ValidationError) as caught:
        MailboxSettings(name="m")
    assert {error["loc"][0] for error in caught.value.errors()} == {"host", "username"}
    with pytest.raises(ValidationError, match="mailbox 'm': auth 'password' needs password"):
        MailboxSettings(name="m", host="imap.internal", username="u")


def test_nested_values_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABASE__URL", "postgresql+psycopg://u@db.internal/x")
    monkeypatch.setenv("MAILROOM_INTAKE__LEASE_S", "12.5")
    monkeypatch.setenv("MAILROOM_BROKER__KIND", "stub")
    monkeypatch.setenv(
        "MAILROOM_INTAKE__MAILBOXES",
        '[{"name": "billing", "host": "imap.internal", "username": "b", "password": "s3cret"}]',
    )
    settings = Settings()
    assert settings.database.url == "postgresql+psycopg://u@db.internal/x"
    assert settings.intake.lease_s == 12.5
    assert settings.broker.kind == "stub"
    (mailbox,) = settings.intake.mailboxes
    assert mailbox.name == "billing"
    assert mailbox.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)


def test_sentinels_and_their_master_go_together_as_host_port_pairs():
    import pytest

    from mailroom.settings import RedisSettings

    with pytest.raises(ValueError, match="sentinels and sentinel_master go together"):
        RedisSettings(sentinels=["a:26379"])
    with pytest.raises(ValueError, match="sentinel 'a' is not host:port"):
        RedisSettings(sentinels=["a"], sentinel_master="m")
    settings = RedisSettings(sentinels=["a:1", "[::1]:2"], sentinel_master="m")
    assert settings.sentinel_addresses == [("a", 1), ("::1", 2)]
