"""Redis clients bounded in time that ride out a Redis restart.

Without these options a client waits forever on a black-holed server, and after
a restart every pooled connection is dead: the first command on each fails
although Redis is back. Timeouts bound every wait; the health check PINGs a
connection idle longer than its interval before use; the retry reconnects and
repeats a command that hit a connection error or timeout, with a doubling wait,
so a restart of a few seconds costs those seconds and no failed call.

A repeated command may have run once already (the reply was lost); every
caller is Postgres-first and its Redis writes are idempotent or deduplicated.

With ``redis.sentinels`` a client asks the sentinels for the master and follows a
failover: a command that meets the demoted master (a read-only reply) or a dead one
fails its connection, and the retry asks the sentinels again.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.retry
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, RedisError, TimeoutError

from mailroom.settings import RedisSettings

RETRIED_ERRORS: tuple[type[RedisError], ...] = (ConnectionError, TimeoutError)


def _options(url: str, settings: RedisSettings, block_s: float) -> dict[str, Any]:
    return {
        "socket_connect_timeout": settings.connect_timeout_s,
        # A blocking read (XREADGROUP BLOCK) is silent for its block time: the
        # socket must wait that long plus the usual reply time.
        "socket_timeout": settings.socket_timeout_s + block_s,
        "health_check_interval": settings.health_check_interval_s,
        "retry_on_error": list(RETRIED_ERRORS),
        **link_options(url, settings),
    }


def link_options(url: str, settings: RedisSettings) -> dict[str, Any]:
    """ACL login and, for a ``rediss://`` URL, TLS files (a login in the URL wins)."""
    options: dict[str, Any] = {}
    if settings.username:
        options["username"] = settings.username
    if settings.password.get_secret_value():
        options["password"] = settings.password.get_secret_value()
    # NOTE: only a rediss:// URL builds an SSL connection; a plain one refuses ssl_* arguments.
    if url.startswith("rediss://"):
        tls = settings.tls
        options["ssl_cert_reqs"] = "required"
        options["ssl_check_hostname"] = True
        if tls.ca_file is not None:
            options["ssl_ca_certs"] = str(tls.ca_file)
        if tls.cert_file is not None and tls.key_file is not None:
            options["ssl_certfile"] = str(tls.cert_file)
            options["ssl_keyfile"] = str(tls.key_file)
    return options


#: Retries of an operator command's client: one replaces a dead pooled connection; an
#: operator waits for no backoff schedule before hearing that Redis is down.
CLI_REDIS_ATTEMPTS = 1


def _retry_args(
    settings: RedisSettings, attempts: int | None
) -> tuple[ExponentialBackoff, int, tuple[type[RedisError], ...]]:
    """What both clients' ``Retry`` take: backoff, retries (``attempts`` if given), errors."""
    backoff = ExponentialBackoff(
        cap=settings.retry_backoff_cap_s, base=settings.retry_backoff_base_s
    )
    return backoff, settings.retry_attempts if attempts is None else attempts, RETRIED_ERRORS


def async_client(
    url: str,
    settings: RedisSettings,
    *,
    block_s: float = 0.0,
    attempts: int | None = None,
    **extra: Any,
) -> aioredis.Redis:
    """An asyncio client for ``url``; ``block_s`` is its longest blocking read.

    ``attempts`` overrides ``settings.retry_attempts`` (operator commands fail fast).
    """
    retry = redis.asyncio.retry.Retry(*_retry_args(settings, attempts))
    if settings.sentinels:
        sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            settings.sentinel_addresses, sentinel_kwargs=_sentinel_options(settings)
        )
        return sentinel.master_for(  # type: ignore[no-any-return]
            settings.sentinel_master,
            redis_class=_AsyncSentinelRedis,
            retry=retry,
            **_async_master_options(url, settings, block_s),
            **extra,
        )
    return aioredis.Redis.from_url(url, retry=retry, **_options(url, settings, block_s), **extra)


def sync_client(
    url: str,
    settings: RedisSettings,
    *,
    block_s: float = 0.0,
    attempts: int | None = None,
    **extra: Any,
) -> redis.Redis:
    """A blocking client for ``url`` (Dramatiq's broker, CLI tools).

    ``attempts`` overrides ``settings.retry_attempts`` for callers with a retry loop of their own.
    """
    retry = redis.retry.Retry(*_retry_args(settings, attempts))
    if settings.sentinels:
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            settings.sentinel_addresses, sentinel_kwargs=_sentinel_options(settings)
        )
        return sentinel.master_for(  # type: ignore[no-any-return,no-untyped-call]
            settings.sentinel_master,
            redis_class=_SyncSentinelRedis,
            retry=retry,
            **_master_options(url, settings, block_s),
            **extra,
        )
    return redis.Redis.from_url(url, retry=retry, **_options(url, settings, block_s), **extra)


class _AsyncSentinelConnection(redis.asyncio.sentinel.SentinelManagedConnection):
    """Asks the sentinels for the master each time it connects, as the blocking one does.

    redis-py's asyncio connection reconnects a dropped connection without its Sentinel
    lookup (``send_packed_command`` skips ``connect``), so after a failover its retries
    went to the dead master until they ran out.
    """

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if self.connection_pool.is_master and not self.is_connected:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(*args, **kwargs)


class _AsyncSentinelSSLConnection(_AsyncSentinelConnection, redis.asyncio.SSLConnection):
    """The same over TLS (a ``rediss://`` link)."""


def _master_options(url: str, settings: RedisSettings, block_s: float) -> dict[str, Any]:
    """Connection options of a Sentinel master: the URL's database and login, no host."""
    parts = urlsplit(url)
    options = _options(url, settings, block_s)
    options["db"] = int(parts.path.strip("/") or 0)
    if parts.username:
        options["username"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
    if parts.scheme == "rediss":
        options["ssl"] = True
    return options


def _async_master_options(url: str, settings: RedisSettings, block_s: float) -> dict[str, Any]:
    options = _master_options(url, settings, block_s)
    tls = options.pop("ssl", False)
    options["connection_class"] = _AsyncSentinelSSLConnection if tls else _AsyncSentinelConnection
    return options


def _sentinel_options(settings: RedisSettings) -> dict[str, Any]:
    """How to reach the sentinels: the link's timeouts, their own login and TLS."""
    options: dict[str, Any] = {
        "socket_connect_timeout": settings.connect_timeout_s,
        "socket_timeout": settings.socket_timeout_s,
    }
    if settings.sentinel_username:
        options["username"] = settings.sentinel_username
    if settings.sentinel_password.get_secret_value():
        options["password"] = settings.sentinel_password.get_secret_value()
    if settings.sentinel_tls:
        options.update(ssl=True, ssl_cert_reqs="required", ssl_check_hostname=True)
        tls = settings.tls
        if tls.ca_file is not None:
            options["ssl_ca_certs"] = str(tls.ca_file)
        if tls.cert_file is not None and tls.key_file is not None:
            options["ssl_certfile"] = str(tls.cert_file)
            options["ssl_keyfile"] = str(tls.key_file)
    return options


class _SyncSentinelRedis(redis.Redis):
    """A master's client that closes its connections to the sentinels with its own."""

    def close(self) -> None:
        super().close()
        for sentinel in self.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
            sentinel.close()


class _AsyncSentinelRedis(aioredis.Redis):
    """A master's client that closes its connections to the sentinels with its own."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel in self.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
            await sentinel.aclose()


def is_sentinel_pool(pool: object) -> bool:
    """Whether a client's pool finds its master through sentinels."""
    return isinstance(
        pool, redis.sentinel.SentinelConnectionPool | redis.asyncio.sentinel.SentinelConnectionPool
    )


def sentinels_of(pool: Any) -> list[str]:
    """``host:port`` of each sentinel a Sentinel pool asks."""
    return [
        "{host}:{port}".format(**sentinel.connection_pool.connection_kwargs)
        for sentinel in pool.sentinel_manager.sentinels
    ]


async def link_role(client: aioredis.Redis) -> dict[str, Any]:
    """Where ``client``'s commands go now, that server's role and its replicas; with
    Sentinel also the master's name and the sentinels asked."""
    pool = client.connection_pool
    replication = await client.info("replication")
    report: dict[str, Any] = {
        "role": replication.get("role", "unknown"),
        "replicas": int(replication.get("connected_slaves", 0)),
    }
    if is_sentinel_pool(pool):
        host, port = await pool.get_master_address()  # type: ignore[attr-defined]
        report["address"] = f"{host}:{port}"
        report["master"] = pool.service_name  # type: ignore[attr-defined]
        report["sentinels"] = sentinels_of(pool)
    else:
        options = pool.connection_kwargs
        report["address"] = f"{options.get('host', 'localhost')}:{options.get('port', 6379)}"
    return report
