"""Settings: one pydantic-settings class, the only reader of the environment.

Every entry point (worker, bridge, scheduler, CLI, alembic) builds ``Settings()``
once and passes values down. Defaults point at the embedded dev stack that
``mailroom dev`` starts, so a fresh checkout runs without configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Loopback ports of the embedded dev stack (``mailroom dev``).
DEV_POSTGRES_PORT = 55432
DEV_REDIS_PORT = 56379
DEV_NATS_PORT = 54222
DEV_IMAP_PORT = 51143
DEV_SMTP_PORT = 52525
DEV_WEBHOOK_PORT = 58080


class DatabaseSettings(BaseModel):
    url: str = f"postgresql+psycopg://postgres@127.0.0.1:{DEV_POSTGRES_PORT}/mailroom"
    pool_size: int = 5
    #: Longest a statement may run before Postgres cancels it, in milliseconds.
    statement_timeout_ms: int = 30_000


class RedisSettings(BaseModel):
    url: str = f"redis://127.0.0.1:{DEV_REDIS_PORT}/0"


class BrokerSettings(BaseModel):
    kind: Literal["redis", "rabbitmq", "stub"] = "redis"
    #: Used when ``kind`` is ``redis``; empty means ``redis.url``.
    redis_url: str = ""
    rabbitmq_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    namespace: str = "dramatiq"
    #: A worker silent for this long is dead and its messages are requeued, in milliseconds.
    heartbeat_timeout_ms: int = 10_000
    #: How often each worker beats and runs queue maintenance, in seconds.
    maintenance_interval_s: float = 2.0
    #: Default retry backoff for actors without their own policy, in milliseconds.
    retry_min_backoff_ms: int = 1_000
    retry_max_backoff_ms: int = 300_000
    #: How often an idle Dramatiq consumer looks for work, in milliseconds (Dramatiq: 1000).
    #: Every actor hop of a mail can wait this long, so Dramatiq's default alone adds seconds.
    worker_poll_ms: int = 100
    prometheus: bool = False
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = 9191


class NatsSettings(BaseModel):
    url: str = f"nats://127.0.0.1:{DEV_NATS_PORT}"
    jetstream: bool = True
    stream_name: str = "MAILROOM_FILES"
    #: JetStream duplicate window for ``Nats-Msg-Id`` dedupe, in seconds.
    duplicate_window_s: int = 600
    subject_prefix: str = ""
    tabular_subject: str = "files.tabular_uploaded"
    image_subject: str = "files.img_uploaded"
    results_subject: str = "files.tabular_parsed"
    inbox_queue_group: str = "mailroom-inbox"
    recognizer_queue_group: str = "mailroom-recognizer"
    inbox_durable: str = "mailroom-inbox"
    connect_timeout_s: float = 2.0
    #: Wait between reconnect attempts to one server, in seconds.
    reconnect_wait_s: float = 0.5
    #: Connect attempts before the first connection is given up (later ones never stop).
    initial_connect_attempts: int = 2
    #: Longest wait for a flush (core NATS) or publish acks (JetStream), in seconds.
    publish_timeout_s: float = 5.0
    #: JetStream keeps messages of the recognition stream this long, in seconds.
    stream_max_age_s: float = 7 * 24 * 3600
    #: Messages the bridge fetches per JetStream pull.
    bridge_fetch_batch: int = 100
    #: Longest wait of one JetStream pull, in seconds.
    bridge_fetch_timeout_s: float = 1.0
    #: Unacked JetStream messages are redelivered to a bridge after this long, in seconds.
    bridge_ack_wait_s: float = 30.0

    def subject(self, name: str) -> str:
        return f"{self.subject_prefix}{name}"


class StorageSettings(BaseModel):
    kind: Literal["filesystem", "s3"] = "filesystem"
    #: Root folder of the filesystem store; relative paths are under ``state_dir``.
    root: Path = Path("objects")
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    s3_access_key: SecretStr = SecretStr("")
    s3_secret_key: SecretStr = SecretStr("")
    mail_bucket: str = "mailroom-mail"
    incoming_bucket: str = "mailroom-incoming"
    results_bucket: str = "mailroom-results"


class MailboxSettings(BaseModel):
    """One IMAP folder that intake reads; ``name`` is what ``poll_mailbox`` is given."""

    name: str
    host: str = "127.0.0.1"
    port: int = DEV_IMAP_PORT
    security: Literal["ssl", "starttls", "plain"] = "plain"
    #: CA bundle that signs the server's certificate (self-signed servers); empty: system CAs.
    ca_file: Path | None = None
    username: str = "demouser"
    password: SecretStr = SecretStr("demopass")
    folder: str = "INBOX"
    enabled: bool = True
    #: Most mails one poll ingests; a fuller folder re-sends the poll at once.
    batch_size: int = 50
    idle: bool = True
    #: Longest IDLE wait when nothing is new, in seconds.
    idle_timeout_s: float = 10.0
    #: Connect and read timeout of the IMAP socket, in seconds.
    timeout_s: float = 30.0


class IntakeSettings(BaseModel):
    mailboxes: list[MailboxSettings] = Field(default_factory=lambda: [MailboxSettings(name="dev")])
    #: Length of a mailbox lease, in seconds; the heartbeat renews it every third.
    lease_s: float = 60.0
    max_retries: int = 5
    max_backoff_s: float = 300.0
    max_attachment_bytes: int = 25 * 1024 * 1024
    max_mail_bytes: int = 50 * 1024 * 1024
    max_attachments: int = 100
    #: Mails per IMAP FETCH command.
    fetch_chunk: int = 50
    #: Bytes per IMAP FETCH command: mails over fetch_chunk_bytes / fetch_chunk are fetched alone.
    #: Two fetches and three commit groups are in memory at once, so this bounds a poll's memory.
    fetch_chunk_bytes: int = 32 * 1024 * 1024
    #: Mails whose transactions are sent to Postgres together (each mail is still its own
    #: transaction, committed in UID order); the next group is prepared meanwhile.
    commit_group: int = 25


class DocumentType(BaseModel):
    required_fields: list[str] = Field(default_factory=list)


class RecognitionSettings(BaseModel):
    #: A published job with no ack for this long is republished, in seconds.
    ack_timeout_s: float = 30.0
    #: How long a recognition service has to answer, in seconds.
    reply_deadline_s: float = 300.0
    max_republish: int = 3
    publish_batch_size: int = 500
    #: Attempts in all (the first included) before a failed result settles.
    automatic_attempts: int = 2
    confidence_threshold: float = 0.8
    document_types: dict[str, DocumentType] = Field(
        default_factory=lambda: {
            "invoice": DocumentType(required_fields=["invoice_number", "total"]),
            "generic": DocumentType(),
        }
    )
    #: Results unmapped for this long are re-sent to mapping by the sweep, in seconds.
    unmapped_after_s: float = 60.0
    #: Jobs one unmapped-result sweep re-sends at most.
    sweep_batch_size: int = 500
    #: Inbox messages larger than this are rejected unread, in bytes.
    max_message_bytes: int = 256 * 1024
    #: Result files larger than this are not mapped, in bytes.
    max_result_bytes: int = 16 * 1024 * 1024


class RecognizerSettings(BaseModel):
    """The reference recognizer (``mailroom recognizer``), with switchable faults for tests."""

    #: Comma-separated faults: drop_acks, duplicate_results, drop_results, fail_with=CODE.
    faults: str = ""
    #: Extra wait before each answer, in seconds.
    delay_s: float = 0.0
    service_name: str = "mailroom-reference-recognizer"


class WebhookAccount(BaseModel):
    url: str
    timeout_s: float = 10.0
    secret: SecretStr | None = None


class EmailAccount(BaseModel):
    host: str = "127.0.0.1"
    port: int = DEV_SMTP_PORT
    security: Literal["ssl", "starttls", "plain"] = "plain"
    username: str | None = None
    password: SecretStr | None = None
    sender: str = "mailroom@localhost"
    timeout_s: float = 10.0


class RateLimit(BaseModel):
    #: Sends allowed per second, on average, for one (channel, account).
    per_second: float
    burst: int = 1


class NotificationRoute(BaseModel):
    mailbox: str = "*"
    document_type: str = "*"
    channel: str = "log"
    account: str = "default"
    recipient: str = "ops"
    subject: str = "Mail {mail_subject!s} processed"
    template: str = "{summary}"


class DeliverySettings(BaseModel):
    #: Not under the broker namespace: Dramatiq keeps its "delivery" queue at "{namespace}:delivery".
    stream_key: str = "mailroom:delivery-stream"
    consumer_group: str = "mailroom-delivery"
    #: Stream entries idle for longer than this are claimed from dead bridges, in milliseconds.
    claim_idle_ms: int = 30_000
    read_count: int = 100
    read_block_ms: int = 1_000
    #: Approximate upper bound on stream length (XADD MAXLEN ~).
    stream_maxlen: int = 100_000
    lock_ttl_ms: int = 30_000
    #: Messages of one batch (``deliver_channel_messages``) sent at the same time.
    batch_concurrency: int = 50
    max_attempts: int = 8
    backoff_base_s: float = 2.0
    backoff_cap_s: float = 600.0
    chunk_size: int = 4_000
    delivered_ttl_s: int = 7 * 24 * 3600
    #: Messages stuck in ``sending`` longer than this are recovered, in seconds.
    stale_after_s: float = 300.0
    #: Pending messages added this long ago and not picked up are re-added, in seconds.
    readd_after_s: float = 600.0
    #: Most messages one re-add or stale-recovery pass handles.
    sweep_batch_size: int = 1_000
    #: How often the bridge looks for entries of dead bridges (XAUTOCLAIM), in milliseconds.
    claim_interval_ms: int = 5_000
    #: Longest wait between the bridge's reconnect attempts, in seconds.
    reconnect_max_backoff_s: float = 10.0
    webhook_accounts: dict[str, WebhookAccount] = Field(default_factory=dict)
    email_accounts: dict[str, EmailAccount] = Field(default_factory=dict)
    rate_limits: dict[str, RateLimit] = Field(default_factory=dict)
    routes: list[NotificationRoute] = Field(default_factory=lambda: [NotificationRoute()])


class SchedulerSettings(BaseModel):
    poll_interval_s: float = 30.0
    outbox_sweep_interval_s: float = 10.0
    watchdog_interval_s: float = 30.0
    stale_delivery_interval_s: float = 60.0
    unmapped_sweep_interval_s: float = 60.0
    pending_delivery_interval_s: float = 60.0
    #: How often final mails without notifications are looked for, in seconds.
    notification_sweep_interval_s: float = 30.0
    broker_maintenance_interval_s: float = 5.0
    #: Postgres advisory lock key that elects the single leader.
    leader_lock_key: int = 0x6D61696C
    #: How often a standby retries the leader lock, in seconds.
    leader_retry_s: float = 1.0


class SentrySettings(BaseModel):
    dsn: SecretStr | None = None
    environment: str = "dev"
    traces_sample_rate: float = 0.0


class LogSettings(BaseModel):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    #: ``text``: one readable line per event; ``json``: one JSON object per line.
    format: Literal["text", "json"] = "text"


class MetricsSettings(BaseModel):
    host: str = "127.0.0.1"
    #: Port of the bridges' and scheduler's metrics endpoint; 0 disables it.
    port: int = 0


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MAILROOM_", env_nested_delimiter="__", extra="ignore"
    )

    #: Folder for the dev stack's data and the filesystem object store.
    state_dir: Path = Path(".mailroom")
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
    sentry: SentrySettings = SentrySettings()
    metrics: MetricsSettings = MetricsSettings()

    @property
    def broker_redis_url(self) -> str:
        return self.broker.redis_url or self.redis.url

    @property
    def storage_root(self) -> Path:
        root = self.storage.root
        return root if root.is_absolute() else self.state_dir / root
