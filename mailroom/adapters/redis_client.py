"""Redis clients bounded in time that ride out a Redis restart.

Without these options a client waits forever on a black-holed server, and after
a restart every pooled connection is dead: the first command on each fails
although Redis is back. Timeouts bound every wait; the health check PINGs a
connection idle longer than its interval before use; the retry reconnects and
repeats a command that hit a connection error or timeout, with a doubling wait,
so a restart of a few seconds costs those seconds and no failed call.

A repeated command may have run once already (the reply was lost); every
caller is Postgres-first and its Redis writes are idempotent or deduplicated.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.retry
import redis.retry
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
    return redis.Redis.from_url(url, retry=retry, **_options(url, settings, block_s), **extra)
