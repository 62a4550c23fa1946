"""A Redis SIGKILLed and restarted costs its downtime, not failed calls on dead pooled connections."""

from __future__ import annotations

import asyncio
import threading

import pytest

from actors.broker.build import build_broker
from mailroom.adapters.redis_client import async_client, sync_client
from mailroom.devtools.stack import EmbeddedRedis
from mailroom.settings import RedisSettings, Settings

pytestmark = pytest.mark.faults

SETTINGS = RedisSettings(retry_backoff_base_s=0.05, retry_backoff_cap_s=1.0, retry_attempts=8)


@pytest.fixture
def server(tmp_path):
    redis = EmbeddedRedis(tmp_path / "redis").start()
    yield redis
    redis.stop()


def _kill(server: EmbeddedRedis) -> None:
    server.kill()
    server.stop()  # closes the log file; start() opens a new one


def _restart(server: EmbeddedRedis) -> None:
    _kill(server)
    server.start()  # same port: it is kept on the server


async def test_an_async_call_after_a_restart_reconnects_through_retries(server):
    client = async_client(server.url, SETTINGS)
    try:
        assert await client.set("k", "1")  # the pool now holds a live connection
        _restart(server)
        # The pooled connection is dead; the retry drops it and reconnects.
        assert await client.set("k", "2")
        assert await client.get("k") == b"2"
    finally:
        await client.aclose()


async def test_an_async_call_while_redis_is_down_waits_for_it(server):
    client = async_client(server.url, SETTINGS)
    try:
        await client.ping()
        _kill(server)
        later = threading.Timer(0.5, server.start)
        later.start()
        try:
            assert await client.incr("n") == 1  # issued while down, answered once back
        finally:
            await asyncio.to_thread(later.join)
    finally:
        await client.aclose()


def test_the_brokers_client_rides_out_a_restart(server):
    # Dramatiq's broker talks through our blocking client, not one built from a bare URL.
    settings = Settings(broker={"kind": "redis", "redis_url": server.url}, redis=SETTINGS)
    broker = build_broker(settings)
    client = broker.client
    try:
        assert client.connection_pool.connection_kwargs["health_check_interval"] == 10
        client.set("k", "1")
        _restart(server)
        assert client.set("k", "2")
        assert client.get("k") == b"2"
    finally:
        broker.close()


def test_a_blocking_client_rides_out_a_restart(server):
    client = sync_client(server.url, SETTINGS)
    try:
        client.set("k", "1")
        _restart(server)
        assert client.set("k", "2")
    finally:
        client.close()


def test_a_blocking_read_outlasts_its_block_time(server):
    client = sync_client(server.url, SETTINGS, block_s=7.0)
    try:
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == SETTINGS.socket_timeout_s + 7.0
        assert kwargs["socket_connect_timeout"] == SETTINGS.connect_timeout_s
    finally:
        client.close()
