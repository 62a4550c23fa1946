"""Redis ACL logins and Postgres ``sslmode`` reach the real servers.

Redis TLS runs on Debian's redis-server (test_links_redis_tls.py). The embedded Postgres is
built without OpenSSL (``ssl=on`` stops it: "SSL is not supported by this build"; ``SHOW ssl``
is off), so the test shows that ``sslmode`` reaches libpq by refusing a server without SSL
when SSL is required.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
import redis
from sqlalchemy import text

from mailroom.adapters.redis_client import async_client, sync_client
from mailroom.cli.errors import describe
from mailroom.db import engine as db
from mailroom.settings import DatabaseSettings, RedisSettings, Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def acl_user(redis_url: str):
    """A Redis ACL user allowed only keys under ``mailroom:``, removed afterwards."""
    name, password = f"mailroom-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = redis.Redis.from_url(redis_url)
    admin.acl_setuser(
        name, enabled=True, passwords=[f"+{password}"], keys=["mailroom:*"], commands=["+@all"]
    )
    yield name, password
    admin.acl_deluser(name)
    admin.close()


async def test_the_async_client_logs_in_as_its_acl_user(redis_url, acl_user):
    name, password = acl_user
    settings = RedisSettings(url=redis_url, username=name, password=password)
    client = async_client(settings.url, settings)
    try:
        assert (await client.acl_whoami()) == name
        await client.set("mailroom:probe", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.set("elsewhere", "1")
    finally:
        await client.aclose()


def test_the_broker_client_logs_in_as_its_acl_user(redis_url, acl_user):
    from actors.broker.build import build_broker

    name, password = acl_user
    settings = Settings(
        broker={"kind": "redis"},
        redis={"url": redis_url, "username": name, "password": password},
    )
    broker = build_broker(settings)
    try:
        assert broker.client.acl_whoami() == name
    finally:
        broker.client.close()


def test_a_wrong_redis_password_is_one_clear_line(redis_url, acl_user):
    name, _ = acl_user
    settings = RedisSettings(url=redis_url, username=name, password="wrong-password")
    client = sync_client(settings.url, settings, attempts=0)
    with pytest.raises(redis.exceptions.AuthenticationError) as caught:
        client.ping()
    client.close()
    failure = describe(caught.value)
    assert failure is not None
    assert failure.lines[0].startswith("mailroom: Redis refused the login")
    assert "wrong-password" not in "\n".join(failure.lines)


def test_the_embedded_postgres_has_no_ssl(database_url):
    with psycopg.connect(db.libpq_dsn(database_url)) as conn:
        assert conn.execute("SHOW ssl").fetchone() == ("off",)


async def test_sslmode_reaches_the_engine_and_direct_connections(database_url):
    required = DatabaseSettings(url=database_url, sslmode="require")
    engine = db.create_engine(required)
    try:
        with pytest.raises(Exception, match="server does not support SSL") as caught:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()
    failure = describe(caught.value)
    assert failure is not None
    assert failure.lines[0].startswith("mailroom: cannot reach Postgres: ")
    assert failure.lines[0].endswith("server does not support SSL, but SSL was required")
    with pytest.raises(psycopg.OperationalError, match="server does not support SSL"):
        psycopg.connect(db.libpq_dsn(db.database_url(required)))

    plain = db.create_engine(DatabaseSettings(url=database_url, sslmode="disable"))
    try:
        async with plain.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await plain.dispose()
