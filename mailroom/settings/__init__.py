"""Settings: one pydantic-settings class, the only reader of the environment.

Every entry point (worker, bridge, scheduler, CLI, alembic) builds ``Settings()``
once and passes values down. Loading is strict: an unknown ``MAILROOM_*`` variable
or nested key, a route template with an unknown placeholder and settings that
contradict each other are errors at load, not at first use.

The server URLs default to loopback ports of the embedded dev stack and carry no
password; nothing else defaults to something that could reach a real system: there
is no default mailbox or mail account, and IMAP and SMTP use TLS unless a mailbox
or account says ``security: plain`` (``mailroom dev`` and the tests do).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from mailroom.settings import checks as settings_checks
from mailroom.settings.base import (
    ACK_WINDOW_MARGIN,
    DEV_IMAP_PORT,
    DEV_NATS_PORT,
    DEV_POSTGRES_PORT,
    DEV_REDIS_PORT,
    DEV_SMTP_PORT,
    DEV_WEBHOOK_PORT,
    IMAP_PORTS,
    ROUTE_PLACEHOLDERS,
    SMTP_PORTS,
    StrictModel,
    TlsFiles,
)
from mailroom.settings.checks import StrictEnvSource
from mailroom.settings.console import ConsoleSettings
from mailroom.settings.delivery import (
    DeliverySettings,
    EmailAccount,
    NotificationRoute,
    RateLimit,
    WebhookAccount,
)
from mailroom.settings.intake import (
    IntakeSettings,
    MailboxSettings,
)
from mailroom.settings.links import (
    BrokerSettings,
    DatabaseSettings,
    NatsSettings,
    RedisSettings,
    StorageSettings,
)
from mailroom.settings.recognition import (
    RecognitionSettings,
    RecognizerSettings,
)
from mailroom.settings.runtime import (
    LogSettings,
    MetricsSettings,
    RetentionSettings,
    RuntimeConfigSettings,
    SchedulerSettings,
    SentrySettings,
)

__all__ = [
    "ACK_WINDOW_MARGIN",
    "DEV_IMAP_PORT",
    "DEV_NATS_PORT",
    "DEV_POSTGRES_PORT",
    "DEV_REDIS_PORT",
    "DEV_SMTP_PORT",
    "DEV_WEBHOOK_PORT",
    "IMAP_PORTS",
    "ROUTE_PLACEHOLDERS",
    "SMTP_PORTS",
    "BrokerSettings",
    "ConsoleSettings",
    "DatabaseSettings",
    "DeliverySettings",
    "EmailAccount",
    "IntakeSettings",
    "LogSettings",
    "MailboxSettings",
    "MetricsSettings",
    "NatsSettings",
    "NotificationRoute",
    "RateLimit",
    "RecognitionSettings",
    "RecognizerSettings",
    "RedisSettings",
    "RetentionSettings",
    "RuntimeConfigSettings",
    "SchedulerSettings",
    "SentrySettings",
    "Settings",
    "StorageSettings",
    "StrictModel",
    "TlsFiles",
    "WebhookAccount",
    "variable_for",
]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MAILROOM_", env_nested_delimiter="__", extra="forbid"
    )

    #: Folder for the dev stack's data and the filesystem object store.
    state_dir: Path = Path(".mailroom")
    #: Folder of secret files, each named like the variable it sets (MAILROOM_DATABASE__URL);
    #: read from the environment only (MAILROOM_SECRETS_DIR). See "Secrets from files".
    secrets_dir: Path | None = None
    log: LogSettings = LogSettings()
    database: DatabaseSettings = DatabaseSettings()
    redis: RedisSettings = RedisSettings()
    broker: BrokerSettings = BrokerSettings()
    nats: NatsSettings = NatsSettings()
    storage: StorageSettings = StorageSettings()
    intake: IntakeSettings = IntakeSettings()
    recognition: RecognitionSettings = RecognitionSettings()
    recognizer: RecognizerSettings = RecognizerSettings()
    delivery: DeliverySettings = DeliverySettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    retention: RetentionSettings = RetentionSettings()
    runtime_config: RuntimeConfigSettings = RuntimeConfigSettings()
    sentry: SentrySettings = SentrySettings()
    metrics: MetricsSettings = MetricsSettings()
    console: ConsoleSettings = ConsoleSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment is read strictly: see mailroom/settings/checks.py.
        return init_settings, StrictEnvSource(settings_cls), dotenv_settings, file_secret_settings

    @model_validator(mode="after")
    def _check_invariants(self) -> Settings:
        """Settings that are each valid but contradict one another."""
        problems = []
        recognition, nats = self.recognition, self.nats
        window_s = recognition.ack_timeout_s * (recognition.max_republish + 1)
        if window_s < ACK_WINDOW_MARGIN * nats.bridge_ack_wait_s:
            # An ack held by a bridge that dies comes back only after bridge_ack_wait_s; the
            # margin leaves as long again for the redelivered hop and the inbox queue. A shorter
            # window dead-letters jobs whose answer is on its way.
            problems.append(
                f"recognition.ack_timeout_s x (recognition.max_republish + 1) = {window_s:g} s "
                f"must be at least {ACK_WINDOW_MARGIN} x nats.bridge_ack_wait_s "
                f"= {ACK_WINDOW_MARGIN * nats.bridge_ack_wait_s:g} s"
            )
        if recognition.silence_after_s >= window_s:
            # The gate holds a silent pipeline's jobs only once it closed: closing after the
            # no-ack window dead-letters them first (NO_ACK), for an outage of the service.
            problems.append(
                f"recognition.silence_after_s = {recognition.silence_after_s:g} s must be below "
                f"the no-ack window recognition.ack_timeout_s x (recognition.max_republish + 1) "
                f"= {window_s:g} s"
            )
        names = [mailbox.name for mailbox in self.intake.mailboxes]
        if len(set(names)) != len(names):
            problems.append(f"intake.mailboxes: names must be unique, got {names}")
        if self.intake.lease_s <= 0:
            problems.append("intake.lease_s must be positive")
        broker = self.broker
        if broker.retry_min_backoff_ms > broker.retry_max_backoff_ms:
            problems.append("broker.retry_min_backoff_ms must not exceed retry_max_backoff_ms")
        problems += _route_problems(self.delivery)
        problems += _redis_link_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def broker_redis_url(self) -> str:
        return self.broker.redis_url or self.redis.url

    @property
    def stream_redis_url(self) -> str:
        """The Redis of the delivery stream (``delivery.redis_url``, else ``redis.url``)."""
        return self.delivery.redis_url or self.redis.url

    @property
    def broker_redis(self) -> RedisSettings:
        """How to reach the broker's Redis: ``redis`` with the broker's own Sentinel master."""
        return _with_master(self.redis, self.broker.sentinel_master)

    @property
    def stream_redis(self) -> RedisSettings:
        """How to reach the delivery stream's Redis: ``redis`` with its own Sentinel master."""
        return _with_master(self.redis, self.delivery.sentinel_master)

    @property
    def storage_root(self) -> Path:
        root = self.storage.root
        return root if root.is_absolute() else self.state_dir / root


def _with_master(redis: RedisSettings, master: str) -> RedisSettings:
    """A link's Redis settings: one set of sentinels may monitor several masters."""
    return redis.model_copy(update={"sentinel_master": master}) if master else redis


def _route_problems(delivery: DeliverySettings) -> list[str]:
    """Routes to a webhook or e-mail account that is not configured (found at load, not at send).

    Other channels are plugins that may take any account name (``log`` does).
    """
    accounts: dict[str, set[str]] = {
        "webhook": set(delivery.webhook_accounts),
        "email": set(delivery.email_accounts),
    }
    return [
        f"delivery.routes.{index}: no {route.channel} account {route.account!r} in "
        f"delivery.{route.channel}_accounts"
        for index, route in enumerate(delivery.routes)
        if route.channel in accounts and route.account not in accounts[route.channel]
    ]


def _redis_link_problems(settings: Settings) -> list[str]:
    """TLS files without a ``rediss://`` URL, or a password given twice."""
    redis, problems = settings.redis, []
    urls = {"redis.url": redis.url}
    if settings.broker.kind == "redis" and settings.broker.redis_url:
        urls["broker.redis_url"] = settings.broker.redis_url
    if settings.delivery.redis_url:
        urls["delivery.redis_url"] = settings.delivery.redis_url
    for name, master in (
        ("broker.sentinel_master", settings.broker.sentinel_master),
        ("delivery.sentinel_master", settings.delivery.sentinel_master),
    ):
        if master and not redis.sentinels:
            problems.append(f"{name} is set but redis.sentinels is empty: give the sentinels")
    for name, url in urls.items():
        parts = urlsplit(url)
        if redis.tls.given and parts.scheme != "rediss":
            problems.append(f"redis.tls is set but {name} is not a rediss:// URL")
        if (parts.password or parts.username) and (
            redis.password.get_secret_value() or redis.username
        ):
            problems.append(f"{name} carries a login and redis.username/password too: give one")
    return problems


def variable_for(loc: Sequence[int | str]) -> str | None:
    """The ``MAILROOM_*`` variable that supplied the setting at ``loc``, if one is set."""
    return settings_checks.variable_for(loc, os.environ)
