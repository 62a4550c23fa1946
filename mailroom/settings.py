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

import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from mailroom import outbound, settings_checks, webhooks
from mailroom.document_types import DocumentType
from mailroom.errors import UnsafeHeaderValue, WebhookTargetRefused
from mailroom.settings_checks import StrictEnvSource, unknown_placeholders
from mailroom.settings_oauth import AuthKind, OAuthSettings, check_login

#: Loopback ports of the embedded dev stack (``mailroom dev``).
DEV_POSTGRES_PORT = 55432
DEV_REDIS_PORT = 56379
DEV_NATS_PORT = 54222
DEV_IMAP_PORT = 51143
DEV_SMTP_PORT = 52525
DEV_WEBHOOK_PORT = 58080

#: Standard ports per ``security`` when a mailbox or account gives none (plain needs one).
IMAP_PORTS = {"ssl": 993, "starttls": 143}
SMTP_PORTS = {"ssl": 465, "starttls": 587}

#: Placeholders of route templates, with a sample value each (``notifications.render_route``).
ROUTE_PLACEHOLDERS: dict[str, Any] = {
    "mail_id": 1,
    "mailbox": "billing",
    "uid": 1,
    "mail_subject": "Invoice March",
    "sender": "billing@example.test",
    "document_types": "invoice",
    "summary": "Mail 'Invoice March' from billing@example.test",
}

#: The recognition no-ack window must be this many times the bridge's ack wait (see Settings).
ACK_WINDOW_MARGIN = 2


class StrictModel(BaseModel):
    """A settings group: unknown keys are errors, so a misspelt key is not silently dropped."""

    model_config = ConfigDict(extra="forbid")


def _default_port(data: Any, ports: dict[str, int], default_security: str) -> Any:
    """``data`` with the standard port of its ``security`` filled in when it names none."""
    if isinstance(data, dict) and not data.get("port"):
        security = data.get("security", default_security)
        if security == "plain":
            raise ValueError("security 'plain' has no standard port: give 'port'")
        if security in ports:
            data = {**data, "port": ports[security]}
    return data


class TlsFiles(StrictModel):
    """Certificates of one TLS link, PEM files; each must exist when given."""

    #: CA bundle that signs the server's certificate; empty: the system's CAs.
    ca_file: Path | None = None
    #: Client certificate for servers that ask for one (mutual TLS); needs key_file.
    cert_file: Path | None = None
    #: Private key of cert_file.
    key_file: Path | None = None

    @model_validator(mode="after")
    def _check_files(self) -> TlsFiles:
        """A missing file or a certificate without its key fails at load, not at connect."""
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: give both or neither")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {str(path)!r} is not a file")
        return self

    @property
    def given(self) -> bool:
        return any((self.ca_file, self.cert_file, self.key_file))


class DatabaseSettings(StrictModel):
    url: str = f"postgresql+psycopg://postgres@127.0.0.1:{DEV_POSTGRES_PORT}/mailroom"
    pool_size: int = 5
    #: Longest a statement may run before Postgres cancels it, in milliseconds.
    statement_timeout_ms: int = 30_000
    #: Longest wait for a new connection, in seconds (libpq counts whole seconds, at least 2).
    connect_timeout_s: int = 5
    #: An idle connection is probed (TCP keepalive) after this long, in seconds.
    keepalive_idle_s: int = 10
    #: Wait between unanswered keepalive probes, in seconds.
    keepalive_interval_s: int = 5
    #: Unanswered probes after which the connection is dead, in probes.
    keepalive_count: int = 3
    #: Unacknowledged data older than this ends the connection, in milliseconds (0: the OS's).
    tcp_user_timeout_ms: int = 25_000
    #: Password of the URL's user, kept out of the URL (a secret, never printed).
    password: SecretStr = SecretStr("")
    #: libpq ``sslmode``; empty: the URL's, else libpq's default (``prefer``). Use
    #: ``verify-full`` with tls.ca_file to refuse a server whose certificate does not match.
    sslmode: Literal["", "disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = ""
    #: ``sslrootcert`` (ca_file), ``sslcert`` and ``sslkey`` (client certificate) of libpq.
    tls: TlsFiles = TlsFiles()

    @model_validator(mode="after")
    def _check_tls(self) -> DatabaseSettings:
        """libpq ignores a root certificate unless sslmode verifies; say so at load."""
        parts = urlsplit(self.url)
        query = parts.query
        if parts.password and self.password.get_secret_value():
            raise ValueError("url carries a password and password is set too: give one")
        if self.sslmode and "sslmode=" in query:
            raise ValueError("sslmode is both in url and in sslmode: give it once")
        if self.tls.given and re.search(r"\bssl(rootcert|cert|key)=", query):
            raise ValueError("url carries sslrootcert/sslcert/sslkey and tls is set too: give one")
        verifies = self.sslmode in ("require", "verify-ca", "verify-full") or (
            not self.sslmode and "sslmode=" in query
        )
        if self.tls.ca_file is not None and not verifies:
            mode = self.sslmode or "prefer"
            raise ValueError(f"tls.ca_file is unused with sslmode {mode!r}: use verify-full")
        return self


class RedisSettings(StrictModel):
    #: ``rediss://`` for TLS (then tls applies); credentials go in username and password.
    url: str = f"redis://127.0.0.1:{DEV_REDIS_PORT}/0"
    #: ACL user (Redis 6+); empty: ``default``. Also used by the broker's Redis.
    username: str = ""
    password: SecretStr = SecretStr("")
    #: CA and client certificate of a ``rediss://`` link.
    tls: TlsFiles = TlsFiles()
    #: Longest wait for a new connection, in seconds.
    connect_timeout_s: float = 2.0
    #: Longest wait for a reply, in seconds (a blocking read waits its block time on top).
    socket_timeout_s: float = 5.0
    #: A pooled connection idle this long is PINGed before use, in seconds (0: never).
    health_check_interval_s: int = 10
    #: Retries of a command after a connection error or timeout, in attempts.
    retry_attempts: int = 6
    #: First wait before a retry, doubled per retry, in seconds.
    retry_backoff_base_s: float = 0.05
    #: Longest wait before a retry, in seconds.
    retry_backoff_cap_s: float = 2.0


class BrokerSettings(StrictModel):
    kind: Literal["redis", "rabbitmq", "stub"] = "redis"
    #: Used when ``kind`` is ``redis``; empty means ``redis.url``.
    redis_url: str = ""
    #: Used when ``kind`` is ``rabbitmq``; carries its user and password.
    rabbitmq_url: str = "amqp://127.0.0.1:5672/"
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


class NatsSettings(StrictModel):
    #: ``tls://`` requires TLS; a server that asks for TLS gets it with ``nats://`` too.
    url: str = f"nats://127.0.0.1:{DEV_NATS_PORT}"
    #: Login by user and password (the server's ``authorization`` or an account's user).
    user: str = ""
    password: SecretStr = SecretStr("")
    #: Login by token.
    token: SecretStr = SecretStr("")
    #: Login by NKey: a file holding the user's seed (``SU…``).
    nkey_seed_file: Path | None = None
    #: Login by JWT and NKey (decentralised auth): a ``.creds`` file.
    creds_file: Path | None = None
    #: CA and client certificate of the TLS link.
    tls: TlsFiles = TlsFiles()
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
    #: How often the client PINGs the server, in seconds (nats-py: 120).
    ping_interval_s: float = 10.0
    #: Unanswered PINGs after which the connection is dead and reconnects, in pings.
    max_outstanding_pings: int = 2
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
    #: Results a core-NATS subscription buffers before it drops more (slow consumer), in messages.
    core_pending_msgs_limit: int = 10_000
    #: Bytes a core-NATS subscription buffers before it drops more (slow consumer), in bytes.
    core_pending_bytes_limit: int = 64 * 1024 * 1024

    def subject(self, name: str) -> str:
        return f"{self.subject_prefix}{name}"

    @model_validator(mode="after")
    def _check_login(self) -> NatsSettings:
        """One way to log in, complete, with its files present."""
        ways = [
            name
            for name, given in (
                ("user/password", self.user or self.password.get_secret_value()),
                ("token", self.token.get_secret_value()),
                ("nkey_seed_file", self.nkey_seed_file),
                ("creds_file", self.creds_file),
            )
            if given
        ]
        if len(ways) > 1:
            raise ValueError(f"give one way to log in, not {' and '.join(ways)}")
        if bool(self.user) != bool(self.password.get_secret_value()):
            raise ValueError("user and password go together: give both or neither")
        for name in ("nkey_seed_file", "creds_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {str(path)!r} is not a file")
            if path is not None and not nkeys_installed():
                raise ValueError(f"{name} needs the nkeys package: pip install 'nats-py[nkeys]'")
        return self


def nkeys_installed() -> bool:
    """Whether nats-py can sign with an NKey (its optional ``nkeys`` package)."""
    return importlib.util.find_spec("nkeys") is not None


class StorageSettings(StrictModel):
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
    #: Longest wait for an S3 connection, in seconds.
    s3_connect_timeout_s: float = 5.0
    #: Longest wait for S3 to send data on an open connection, in seconds.
    s3_read_timeout_s: float = 30.0
    #: Retries of a failed S3 request after the first, in attempts.
    s3_retries: int = 2
    #: Check the S3 server's TLS certificate; off only for a test endpoint.
    s3_verify: bool = True
    #: CA bundle that signs the S3 server's certificate; empty: the system's CAs.
    s3_ca_file: Path | None = None

    @model_validator(mode="after")
    def _check_verify(self) -> StorageSettings:
        if self.s3_ca_file is not None and not self.s3_verify:
            raise ValueError("s3_ca_file is unused with s3_verify false: drop one of them")
        if self.s3_ca_file is not None and not self.s3_ca_file.is_file():
            raise ValueError(f"s3_ca_file {str(self.s3_ca_file)!r} is not a file")
        return self


#: An IMAP flag: a keyword (an atom, RFC 3501) or a system flag such as ``\Flagged``.
_IMAP_FLAG = re.compile(r"\\?[^\x00-\x20\x7f(){%*\"\\\]]+")


class MailboxSettings(StrictModel):
    """One IMAP folder that intake reads; ``name`` is what ``poll_mailbox`` is given."""

    name: str
    host: str
    # NOTE: the 0 never stays (_port_for_security fills or refuses it); it lets callers omit it.
    #: Default: 993 for ``ssl``, 143 for ``starttls``; ``plain`` needs it given.
    port: int = 0
    #: ``plain`` sends the password in clear: only for servers on loopback (``mailroom dev``).
    security: Literal["ssl", "starttls", "plain"] = "ssl"
    #: CA bundle that signs the server's certificate (self-signed servers); empty: system CAs.
    ca_file: Path | None = None
    username: str
    #: Needed with auth ``password``; unused with a token login.
    password: SecretStr = SecretStr("")
    #: ``password`` (LOGIN), or ``xoauth2`` / ``oauthbearer`` with a token from ``oauth``.
    auth: AuthKind = "password"
    #: The token endpoint and grant of a token login (keys: token_url, client_id, client_secret,
    #: grant, refresh_token, scope, refresh_margin_s, timeout_s; see the README on logins).
    oauth: OAuthSettings | None = None
    folder: str = "INBOX"
    enabled: bool = True
    #: Most mails one poll ingests; a fuller folder re-sends the poll at once.
    batch_size: int = 50
    idle: bool = True
    #: Longest IDLE wait when nothing is new, in seconds.
    idle_timeout_s: float = 10.0
    #: A mailbox of real mail: the reference recognizer (``mailroom recognizer``) refuses to
    #: start beside it outside ``mailroom dev``.
    real: bool = False
    #: Connect and read timeout of the IMAP socket, in seconds.
    timeout_s: float = 30.0
    #: Store images shown in the HTML body (by Content-ID) and images under
    #: intake.min_image_bytes without sending them to recognition; false recognizes them too.
    skip_inline_images: bool = True
    #: What intake does to a mail on the server once it is stored: ``none`` leaves it unread
    #: where it is; ``seen`` marks it read; ``flag`` sets after_ingest_flag; ``move`` moves it
    #: to move_to. A failure is logged and never fails or repeats the ingest.
    after_ingest: Literal["none", "seen", "flag", "move"] = "none"
    #: The flag that after_ingest ``flag`` sets: a keyword (``$Mailroom``) or ``\Flagged``.
    after_ingest_flag: str = "$Mailroom"
    #: The folder after_ingest ``move`` moves ingested mail to (it must exist).
    move_to: str | None = None
    #: Days a final mail keeps its body, attachments and result objects; then the retention
    #: pass removes them (rows and documents stay). Empty: kept forever.
    retention_days: int | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _port_for_security(cls, data: Any) -> Any:
        return _default_port(data, IMAP_PORTS, "ssl")

    @model_validator(mode="after")
    def _check_login(self) -> MailboxSettings:
        given = self.password if "password" in self.model_fields_set else None
        check_login(f"mailbox {self.name!r}", self.auth, given, self.oauth)
        return self

    @model_validator(mode="after")
    def _check_after_ingest(self) -> MailboxSettings:
        """A ``move`` with nowhere to go, or a flag the server would refuse, fails at load."""
        if self.after_ingest == "move" and not self.move_to:
            raise ValueError(f"mailbox {self.name!r}: after_ingest 'move' needs move_to (a folder)")
        if self.after_ingest == "move" and self.move_to == self.folder:
            raise ValueError(f"mailbox {self.name!r}: move_to is the folder it reads")
        if not _IMAP_FLAG.fullmatch(self.after_ingest_flag):
            raise ValueError(
                f"mailbox {self.name!r}: after_ingest_flag {self.after_ingest_flag!r} is not an "
                "IMAP flag (a keyword such as $Mailroom, or \\Flagged)"
            )
        return self


class IntakeSettings(StrictModel):
    #: The IMAP folders to read, as a JSON list of objects (keys: see MailboxSettings).
    mailboxes: list[MailboxSettings] = Field(default_factory=list)
    #: Length of a mailbox lease, in seconds; the heartbeat renews it every third.
    lease_s: float = 60.0
    max_retries: int = 5
    max_backoff_s: float = 300.0
    max_attachment_bytes: int = 25 * 1024 * 1024
    max_mail_bytes: int = 50 * 1024 * 1024
    max_attachments: int = 100
    #: How deep forwarded mails (.eml, message/rfc822) and winmail.dat are opened for their
    #: files; 0 stores them whole, unopened.
    max_nesting: int = 3
    #: Images smaller than this are logos and icons, not documents (see a mailbox's
    #: skip_inline_images), in bytes.
    min_image_bytes: int = 4096
    #: Mails per IMAP FETCH command.
    fetch_chunk: int = 50
    #: Bytes per IMAP FETCH command: mails over fetch_chunk_bytes / fetch_chunk are fetched alone.
    #: Two fetches and three commit groups are in memory at once, so this bounds a poll's memory.
    fetch_chunk_bytes: int = 32 * 1024 * 1024
    #: Mails whose transactions are sent to Postgres together (each mail is still its own
    #: transaction, committed in UID order); the next group is prepared meanwhile.
    commit_group: int = 25


class RecognitionSettings(StrictModel):
    #: A published job with no ack for this long is republished, in seconds.
    ack_timeout_s: float = 30.0
    #: How long a recognition service has to answer, in seconds.
    reply_deadline_s: float = 300.0
    max_republish: int = 3
    publish_batch_size: int = 500
    #: Attempts in all (the first included) before a failed result settles.
    automatic_attempts: int = 2
    confidence_threshold: float = 0.8
    #: Per type, the fields its documents need; a list inside ``required`` means one of them:
    #: ``{"fund": {"required": [["investor_name", "customer_id"], "amount"]}}``.
    document_types: dict[str, DocumentType] = Field(
        default_factory=lambda: {
            "invoice": DocumentType(required=["invoice_number", "total"]),
            "generic": DocumentType(),
        }
    )
    #: Results unmapped for this long are re-sent to mapping by the sweep, in seconds.
    unmapped_after_s: float = 60.0
    #: Jobs one unmapped-result sweep re-sends at most.
    sweep_batch_size: int = 500
    #: Jobs one watchdog transaction times out at most; a pass loops over batches, in jobs.
    watchdog_batch_size: int = 500
    #: Inbox messages larger than this are rejected unread, in bytes.
    max_message_bytes: int = 256 * 1024
    #: Result files larger than this are not mapped, in bytes.
    max_result_bytes: int = 16 * 1024 * 1024
    #: Tries of the inbox or of mapping at one job whose worker died (never came back),
    #: counted in Postgres; past them the job fails (`*_ATTEMPTS_EXHAUSTED`).
    max_processing_attempts: int = 5
    #: Health gate: when no service of a pipeline answered (ack or result) for this long while
    #: one of its requests has waited as long unacked, the outbox and the watchdog hold its jobs
    #: (no republish counted, no ``dlq``, no timeout) until a service answers, in seconds. Keep
    #: it under ack_timeout_s x (max_republish + 1), or jobs are dead-lettered before it closes.
    silence_after_s: float = Field(default=60.0, gt=0)


class RecognizerSettings(StrictModel):
    """The reference recognizer (``mailroom recognizer``), with switchable faults for tests."""

    #: Comma-separated faults: drop_acks, duplicate_results, drop_results, fail_with=CODE.
    faults: str = ""
    #: Extra wait before each answer, in seconds.
    delay_s: float = 0.0
    service_name: str = "mailroom-reference-recognizer"
    #: Run even beside a mailbox marked ``real`` (its extraction is not fit for real mail);
    #: ``mailroom dev`` sets it for its own stack.
    allow_real_mailboxes: bool = False


class WebhookAccount(StrictModel):
    url: str
    timeout_s: float = 10.0
    #: Active signing secrets (``whsec_<base64 key>``, or a raw string of 16+ bytes); each signs
    #: every request (``webhook-signature``), so a new one can be added before the old one goes.
    #: A single ``secret`` key is still read as a list of one.
    secrets: list[SecretStr] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _single_secret(cls, data: Any) -> Any:
        """The older single ``secret`` key joins ``secrets``."""
        if isinstance(data, dict) and "secret" in data:
            data = dict(data)
            single = data.pop("secret")
            data["secrets"] = [*data.get("secrets", []), *([single] if single else [])]
        return data

    @model_validator(mode="after")
    def _check_secrets(self) -> WebhookAccount:
        for index, secret in enumerate(self.secrets):
            try:
                webhooks.secret_key(secret.get_secret_value())
            except ValueError as exc:
                raise ValueError(f"secrets.{index}: {exc}") from None
        return self


class EmailAccount(StrictModel):
    host: str
    # NOTE: the 0 never stays (_port_for_security fills or refuses it); it lets callers omit it.
    #: Default: 587 for ``starttls``, 465 for ``ssl``; ``plain`` needs it given.
    port: int = 0
    #: ``plain`` sends mail (and any password) in clear: only for loopback sinks.
    security: Literal["ssl", "starttls", "plain"] = "starttls"
    username: str | None = None
    password: SecretStr | None = None
    #: ``password`` (AUTH with username and password when username is set), or ``xoauth2`` /
    #: ``oauthbearer`` with a token from ``oauth`` for ``username``.
    auth: AuthKind = "password"
    #: The token endpoint and grant of a token login (keys: token_url, client_id, client_secret,
    #: grant, refresh_token, scope, refresh_margin_s, timeout_s; see the README on logins).
    oauth: OAuthSettings | None = None
    sender: str = "mailroom@localhost"
    timeout_s: float = 10.0

    @model_validator(mode="before")
    @classmethod
    def _port_for_security(cls, data: Any) -> Any:
        return _default_port(data, SMTP_PORTS, "starttls")

    @model_validator(mode="after")
    def _check_sender(self) -> EmailAccount:
        """A sender with CR, LF or a control would inject headers: refused at load."""
        try:
            outbound.check_header_value("From", self.sender)
        except UnsafeHeaderValue as exc:
            raise ValueError(f"sender: {exc}") from None
        return self

    @model_validator(mode="after")
    def _check_login(self) -> EmailAccount:
        if self.auth != "password" and not self.username:
            raise ValueError(f"auth {self.auth!r} needs username (the mailbox the token is for)")
        check_login("email account", self.auth, self.password or SecretStr(""), self.oauth)
        return self


class RateLimit(StrictModel):
    #: Sends allowed per second, on average, for one (channel, account).
    per_second: float
    burst: int = 1


class NotificationRoute(StrictModel):
    mailbox: str = "*"
    document_type: str = "*"
    channel: str = "log"
    account: str = "default"
    recipient: str = "ops"
    #: ``str.format`` templates (checked at load) over {mail_id}, {mailbox}, {uid},
    #: {mail_subject}, {sender}, {document_types} and {summary}.
    subject: str = "Mail {mail_subject!s} processed"
    template: str = "{summary}"

    @model_validator(mode="after")
    def _check_templates(self) -> NotificationRoute:
        """Unknown placeholders fail at load, not when the first mail is notified."""
        route = f"route {self.channel}:{self.account} -> {self.recipient}"
        for name in ("subject", "template"):
            text = getattr(self, name)
            try:
                unknown = unknown_placeholders(text, ROUTE_PLACEHOLDERS)
                if not unknown:
                    text.format_map(ROUTE_PLACEHOLDERS)
            except (ValueError, KeyError, AttributeError, IndexError, TypeError) as exc:
                raise ValueError(f"{route}: {name} {text!r} cannot be formatted: {exc}") from None
            if unknown:
                raise ValueError(
                    f"{route}: unknown placeholder {{{unknown[0]}}} in {name}; "
                    f"known: {', '.join(ROUTE_PLACEHOLDERS)}"
                )
        return self


class DeliverySettings(StrictModel):
    #: Redis of the delivery stream, locks and rate limits; empty means ``redis.url``.
    redis_url: str = ""
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
    #: Final mails one notification pass handles (the actor re-sends itself for more), in mails.
    notification_batch_size: int = 100
    #: How often the bridge looks for entries of dead bridges (XAUTOCLAIM), in milliseconds.
    claim_interval_ms: int = 5_000
    #: Longest wait between the bridge's reconnect attempts, in seconds.
    reconnect_max_backoff_s: float = 10.0
    webhook_accounts: dict[str, WebhookAccount] = Field(default_factory=dict)
    #: Hosts webhooks may be sent to: names (hooks.example.com), *.example.com, * for any name,
    #: IP addresses and networks (10.0.0.0/8). Loopback, private, link-local and other
    #: non-public addresses are refused, at load and in every send's DNS answer, unless listed.
    webhook_allowed_hosts: list[str] = Field(default_factory=list)
    #: Let webhooks go over plain http:// (mailroom dev, tests); off: https only.
    webhook_allow_http: bool = False
    email_accounts: dict[str, EmailAccount] = Field(default_factory=dict)
    rate_limits: dict[str, RateLimit] = Field(default_factory=dict)
    routes: list[NotificationRoute] = Field(default_factory=lambda: [NotificationRoute()])

    @property
    def webhook_allow_list(self) -> outbound.AllowList:
        return outbound.AllowList.parse(
            self.webhook_allowed_hosts, allow_http=self.webhook_allow_http
        )

    @model_validator(mode="after")
    def _check_webhook_targets(self) -> DeliverySettings:
        """Each webhook URL is on the allow-list (its DNS answers are checked at each send)."""
        try:
            allow = self.webhook_allow_list
        except ValueError as exc:
            raise ValueError(f"webhook_allowed_hosts: {exc}") from None
        for name, account in self.webhook_accounts.items():
            try:
                outbound.check_url(account.url, allow)
            except WebhookTargetRefused as exc:
                raise ValueError(f"webhook_accounts.{name}: {exc}") from None
        return self


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


class LogSettings(StrictModel):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    #: ``text``: one readable line per event; ``json``: one JSON object per line.
    format: Literal["text", "json"] = "text"


class MetricsSettings(StrictModel):
    host: str = "127.0.0.1"
    #: Port of the bridges' and scheduler's metrics endpoint; 0 disables it.
    port: int = 0


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

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment is read strictly: see mailroom/settings_checks.py.
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
    def storage_root(self) -> Path:
        root = self.storage.root
        return root if root.is_absolute() else self.state_dir / root


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
