"""Settings of the links to the servers: Postgres, Redis, the broker, NATS, the object store."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, model_validator

from mailroom.settings.base import (
    DEV_NATS_PORT,
    DEV_POSTGRES_PORT,
    DEV_REDIS_PORT,
    StrictModel,
    TlsFiles,
)


class DatabaseSettings(StrictModel):
    #: Also libpq's several hosts (``…@h1:5432,h2:5432/db``) or SQLAlchemy's (``?host=h1:5432&host=h2:5432``).
    url: str = f"postgresql+psycopg://postgres@127.0.0.1:{DEV_POSTGRES_PORT}/mailroom"
    #: Servers of a primary and its standbys (``host:port``), tried in order; when given they
    #: replace the URL's host. Every connection (engines, alembic, leader election, gauges,
    #: status) takes the first that accepts ``target_session_attrs``.
    hosts: list[str] = []
    #: libpq's ``target_session_attrs``; empty: ``read-write`` with several hosts, else
    #: libpq's default (any server).
    target_session_attrs: Literal[
        "", "any", "read-write", "read-only", "primary", "standby", "prefer-standby"
    ] = ""
    #: Connections a process keeps open; a worker keeps at least one per thread (its actors).
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
    #: Sentinels (``host:port``) that name the master. When given, every Redis link asks them
    #: for ``sentinel_master`` and follows a failover; its URL then gives only the scheme
    #: (``rediss://`` for TLS), the database and a login, and its host is unused.
    sentinels: list[str] = []
    #: The master's name as the sentinels monitor it (``sentinel monitor NAME …``).
    sentinel_master: str = ""
    #: Login of the sentinels themselves (``requirepass`` or an ACL user in sentinel.conf).
    sentinel_username: str = ""
    sentinel_password: SecretStr = SecretStr("")
    #: The sentinels speak TLS (with ``tls``'s CA and client certificate).
    sentinel_tls: bool = False

    @model_validator(mode="after")
    def _check_sentinels(self) -> RedisSettings:
        if bool(self.sentinels) != bool(self.sentinel_master):
            raise ValueError("sentinels and sentinel_master go together: give both or neither")
        for address in self.sentinels:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"sentinel {address!r} is not host:port")
        return self

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """The sentinels as (host, port) pairs."""
        pairs = [address.rpartition(":") for address in self.sentinels]
        return [(host.strip("[]"), int(port)) for host, _, port in pairs]


class BrokerSettings(StrictModel):
    kind: Literal["redis", "rabbitmq", "stub"] = "redis"
    #: Used when ``kind`` is ``redis``; empty means ``redis.url``.
    redis_url: str = ""
    #: With ``redis.sentinels``: the name the sentinels monitor this link's master under, when
    #: the broker has a Redis of its own; empty means ``redis.sentinel_master``.
    sentinel_master: str = ""
    #: How long a send is tried again while Redis is unreachable (a Sentinel failover takes
    #: 2 to 5 s with ``down-after-milliseconds 1000``), in seconds; then the sender sees the error.
    send_retry_s: float = 10.0
    #: Longest wait for a Redis replica to confirm what the NATS bridge enqueued before it
    #: acks JetStream (``WAIT``; only when Redis has replicas), in milliseconds.
    replica_wait_ms: int = 1_000
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
    #: Longest an idle Dramatiq consumer waits before it looks for work unasked, in
    #: milliseconds (Dramatiq's default). Enqueues wake consumers at once (Redis broker);
    #: this bounds the wait only for work nobody announced, such as a dead worker's requeue.
    worker_poll_ms: int = 1_000
    prometheus: bool = False
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = 9191


class NatsSettings(StrictModel):
    #: One server. ``tls://`` requires TLS; a server that asks for TLS gets it with ``nats://`` too.
    url: str = f"nats://127.0.0.1:{DEV_NATS_PORT}"
    #: Several servers of one cluster (each spelled as ``url``); when given, ``url`` is unused.
    #: The client learns the cluster's other servers from the ones it reaches.
    servers: list[str] = []
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
    #: Connect without a login. Off, a link with no user, token, NKey or creds file (and none
    #: in the URL) is refused at start: a server that lets anyone in lets anyone read the
    #: requests and answer them. ``mailroom dev`` sets it for its embedded server.
    allow_anonymous: bool = False
    jetstream: bool = True
    stream_name: str = "MAILROOM_FILES"
    #: Copies of the stream Mailroom creates, in servers (3 on a cluster). An existing stream
    #: with another count is refused, never changed.
    stream_replicas: int = Field(default=1, ge=1, le=5)
    #: Create the stream and the inbox consumer when missing and add the subjects the stream
    #: lacks; false: only check that both exist (a runtime user without stream-admin rights,
    #: as in production: ``mailroom nats setup`` makes them with an administrator's login).
    manage_stream: bool = True
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
    # Each inbox batch costs its worker and Postgres a fixed part (the actor message, the
    # statements and commits, the follow-up sends, the thread switches: about 10 ms of worker
    # CPU on two busy cores) beside ~45 us a result; 200 a batch rather than 100 takes the
    # worker's CPU per result from ~145 to ~95 us (bench/outbox.py).
    #: Messages the bridge fetches per JetStream pull, and most it sends in one actor message.
    bridge_fetch_batch: int = 200
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

    @property
    def server_urls(self) -> list[str]:
        """The servers to connect to: ``servers`` when given, else ``url``."""
        return list(self.servers) if self.servers else [self.url]

    @property
    def has_login(self) -> bool:
        """Whether a login is set: user, token, NKey or creds file, or one in a server's URL."""
        given = self.user or self.token.get_secret_value()
        in_url = any("@" in url.partition("://")[2].partition("/")[0] for url in self.server_urls)
        return bool(given or self.nkey_seed_file or self.creds_file or in_url)

    @property
    def is_dev_stack(self) -> bool:
        """Whether every server is ``mailroom dev``'s embedded one (loopback, its port)."""
        return all(_is_dev_nats(url) for url in self.server_urls)

    def anonymous_refusal(self) -> str | None:
        """One line when this link has no login and ``allow_anonymous`` is off; else None.

        The dev stack's own server is exempt, so a command beside ``mailroom dev`` needs no
        setting, as for its other links.
        """
        if self.allow_anonymous or self.has_login or self.is_dev_stack:
            return None
        return (
            "NATS has no login (nats.user and password, token, nkey_seed_file or creds_file): "
            "anyone who reaches the server could read the requests and answer them; give "
            "Mailroom its NATS user, or set MAILROOM_NATS__ALLOW_ANONYMOUS=true for a server "
            "meant to be open"
        )

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
        if self.nkey_seed_file is not None:
            seed = _read("nkey_seed_file", self.nkey_seed_file)
            _check_seed("nkey_seed_file", self.nkey_seed_file, seed)
        if self.creds_file is not None:
            _check_creds(self.creds_file)
        return self


def _is_dev_nats(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.hostname in ("127.0.0.1", "localhost", "::1") and parts.port == DEV_NATS_PORT
    except ValueError:
        return False


def _read(name: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{name} {str(path)!r} cannot be read: {exc.strerror}") from exc


def _check_seed(name: str, path: Path, seed: bytes) -> None:
    """A seed nats-py can sign with; the message never shows the seed."""
    import nkeys

    try:
        nkeys.from_seed(bytearray(seed.strip())).wipe()
    except Exception as exc:
        raise ValueError(f"{name} {str(path)!r} holds no valid NKey seed (SU...)") from exc


def _check_creds(path: Path) -> None:
    """A ``.creds`` file with a user JWT and a user seed, each on the line after its header.

    nats-py reads the JWT until it finds the header: without it, it would loop for ever.
    """
    lines = _read("creds_file", path).splitlines()

    def after(header: bytes) -> bytes:
        for number, line in enumerate(lines[:-1]):
            if header in line:
                return lines[number + 1].strip()
        raise ValueError(f"creds_file {str(path)!r} has no {header.decode()} section")

    if not after(b"BEGIN NATS USER JWT"):
        raise ValueError(f"creds_file {str(path)!r} has an empty user JWT")
    _check_seed("creds_file", path, after(b"BEGIN USER NKEY SEED"))


class StorageSettings(StrictModel):
    kind: Literal["filesystem", "s3"] = "filesystem"
    #: Root folder of the filesystem store; relative paths are under ``state_dir``.
    root: Path = Path("objects")
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    #: The access key id: an identifier, shown in logs as it is (the secret key is the secret).
    s3_access_key: str = ""
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

    @model_validator(mode="after")
    def _check_results_bucket(self) -> StorageSettings:
        """A result names its object by bucket: in a bucket shared with mails or attachments
        it could name a mail's ``.eml`` and be taken for a result object."""
        for name in ("mail_bucket", "incoming_bucket"):
            if getattr(self, name) == self.results_bucket:
                raise ValueError(
                    f"results_bucket and {name} are both {self.results_bucket!r}: "
                    "give recognition results a bucket of their own"
                )
        return self
