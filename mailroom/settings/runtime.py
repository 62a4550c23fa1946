"""Settings of the processes around the pipelines: runtime configuration, retention,
the scheduler, Sentry, logs and metrics."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from mailroom.settings.base import (
    StrictModel,
)


class RuntimeConfigSettings(StrictModel):
    """Mailboxes, channel accounts and routes kept in Postgres (``mailroom mailboxes|accounts|routes``)."""

    #: Fernet key (urlsafe base64 of 32 bytes) that encrypts the secrets of those rows;
    #: needed to store or read a row with a secret. Several, comma-separated: the first
    #: encrypts, all decrypt (rotation).
    key: SecretStr = SecretStr("")
    #: Copy the environment's mailboxes, accounts and routes into the table at start
    #: (rows an operator changed are left alone).
    seed: bool = True

    @field_validator("key")
    @classmethod
    def _check_key(cls, key: SecretStr) -> SecretStr:
        """A mistyped key fails at load, not at the first row with a secret."""
        from cryptography.fernet import Fernet

        if not key.get_secret_value():
            return key
        for index, part in enumerate(key.get_secret_value().split(",")):
            try:
                Fernet(part.strip())
            except (ValueError, TypeError):
                raise ValueError(
                    f"key {index + 1} is not a Fernet key (urlsafe base64 of 32 bytes; make one "
                    "with: python -c 'from cryptography.fernet import Fernet; "
                    "print(Fernet.generate_key().decode())')"
                ) from None
        return key


class RetentionSettings(StrictModel):
    """The retention pass (a mailbox's ``retention_days``) and object deletion after erase."""

    #: Mails one retention transaction purges at most.
    batch_size: int = Field(default=100, gt=0)
    #: Batches one pass runs at most; the rest waits for the next pass.
    max_batches: int = Field(default=20, gt=0)
    #: An object whose last row went is deleted from the store only this long after, in
    #: seconds: an intake storing the same bytes again meanwhile registers it anew and keeps it.
    deletion_grace_s: float = Field(default=300.0, ge=0)


class SchedulerSettings(StrictModel):
    poll_interval_s: float = 30.0
    outbox_sweep_interval_s: float = 10.0
    watchdog_interval_s: float = 30.0
    stale_delivery_interval_s: float = 60.0
    unmapped_sweep_interval_s: float = 60.0
    pending_delivery_interval_s: float = 60.0
    #: How often final mails without notifications are looked for, in seconds.
    notification_sweep_interval_s: float = 30.0
    broker_maintenance_interval_s: float = 5.0
    #: How often the retention pass runs (mailboxes with retention_days), in seconds.
    retention_interval_s: float = 3600.0
    #: Postgres advisory lock key that elects the single leader.
    leader_lock_key: int = 0x6D61696C
    #: How often a standby retries the leader lock, in seconds.
    leader_retry_s: float = 1.0


class SentrySettings(StrictModel):
    dsn: SecretStr | None = None
    environment: str = "dev"
    traces_sample_rate: float = 0.0
    #: URLs (regular expressions, matched anywhere in the URL) of our own services that may
    #: receive Sentry's ``sentry-trace`` and ``baggage`` headers; empty: no request carries
    #: them, so webhook receivers and other third parties never see our trace or Sentry key.
    trace_propagation_targets: list[str] = Field(default_factory=list)


class LogSettings(StrictModel):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    #: ``text``: one readable line per event; ``json``: one JSON object per line.
    format: Literal["text", "json"] = "text"


class MetricsSettings(StrictModel):
    host: str = "127.0.0.1"
    #: Port of the bridges' and scheduler's metrics endpoint; 0 disables it.
    port: int = 0
