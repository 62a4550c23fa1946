"""Link settings (NATS, Redis, Postgres, S3): strict at load in one line, and the options that
reach each client."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from mailroom.adapters.nats.login import connect_error, connect_options
from mailroom.adapters.redis_client import async_client, link_options, sync_client
from mailroom.cli.errors import describe
from mailroom.db.engine import create_engine, database_url, libpq_dsn
from mailroom.process.observability import secret_values
from mailroom.settings import (
    DatabaseSettings,
    NatsSettings,
    RedisSettings,
    Settings,
    StorageSettings,
    TlsFiles,
)
from tests.fixtures.links import creds_text, new_user_seed


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    """A file that exists (the settings check existence, not contents)."""
    path = tmp_path / "file.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def _one_line(exc: BaseException) -> str:
    failure = describe(exc)
    assert failure is not None
    assert len(failure.lines) == 1, failure.lines
    return failure.lines[0]


def test_a_creds_file_that_does_not_exist_fails_at_load_in_one_line(tmp_path):
    with pytest.raises(ValidationError) as caught:
        Settings(nats={"creds_file": str(tmp_path / "missing.creds")})
    line = _one_line(caught.value)
    assert "nats: creds_file" in line and "missing.creds" in line and "is not a file" in line


def test_a_client_certificate_without_its_key_fails_at_load(pem):
    with pytest.raises(ValidationError) as caught:
        Settings(redis={"url": "rediss://127.0.0.1:6380/0", "tls": {"cert_file": str(pem)}})
    assert "redis.tls: cert_file and key_file go together" in _one_line(caught.value)


def test_two_ways_to_log_in_to_nats_are_refused(pem):
    with pytest.raises(ValidationError, match="not user/password and token"):
        NatsSettings(user="u", password="p", token="t")
    with pytest.raises(ValidationError, match="user and password go together"):
        NatsSettings(user="u")


def test_redis_tls_files_need_a_rediss_url(pem):
    with pytest.raises(ValidationError) as caught:
        Settings(redis={"tls": {"ca_file": str(pem)}})
    assert "MAILROOM_REDIS__TLS is set but MAILROOM_REDIS__URL is not a rediss:// URL" in _one_line(
        caught.value
    )


def test_a_redis_login_in_the_url_and_in_the_settings_is_refused():
    with pytest.raises(ValidationError, match=r"carries a login and redis\.username/password"):
        Settings(redis={"url": "redis://:pw@127.0.0.1/0", "password": "other"})


def test_a_postgres_root_certificate_without_a_verifying_sslmode_is_refused(pem):
    with pytest.raises(ValidationError, match="unused with sslmode 'prefer': use verify-full"):
        DatabaseSettings(tls=TlsFiles(ca_file=pem))
    with pytest.raises(ValidationError, match="sslmode is both in url and in sslmode"):
        DatabaseSettings(url="postgresql+psycopg://h/db?sslmode=require", sslmode="verify-full")


def test_an_s3_ca_file_with_verification_off_is_refused(pem):
    with pytest.raises(ValidationError, match="s3_ca_file is unused with s3_verify false"):
        StorageSettings(s3_verify=False, s3_ca_file=pem)


@pytest.mark.parametrize("shared", ["mail_bucket", "incoming_bucket"])
def test_a_results_bucket_shared_with_mails_or_attachments_fails_at_load(shared):
    with pytest.raises(ValidationError) as caught:
        Settings(storage={"results_bucket": "everything", shared: "everything"})
    line = _one_line(caught.value)
    assert f"storage: results_bucket and {shared} are both 'everything'" in line


def test_every_link_secret_is_a_secret_str_and_is_scrubbed():
    settings = Settings(
        nats={"user": "mailroom", "password": "nats-pass"},
        redis={"username": "mailroom", "password": "redis-pass"},
    )
    assert {"nats-pass", "redis-pass"} <= secret_values(settings)
    shown = repr(settings) + str(settings.model_dump())
    assert "nats-pass" not in shown and "redis-pass" not in shown
    settings = Settings(nats={"token": "nats-token"})
    assert "nats-token" in secret_values(settings) and "nats-token" not in repr(settings)


def test_a_malformed_nkey_seed_or_creds_file_fails_at_load_in_one_line(pem, tmp_path):
    with pytest.raises(ValidationError) as caught:
        Settings(nats={"nkey_seed_file": str(pem)})
    assert "nats: nkey_seed_file" in _one_line(caught.value)
    assert "holds no valid NKey seed" in _one_line(caught.value)
    # Without its JWT header nats-py would read the file for ever: refused at load instead.
    with pytest.raises(ValidationError) as caught:
        Settings(nats={"creds_file": str(pem)})
    assert "has no BEGIN NATS USER JWT section" in _one_line(caught.value)
    creds = tmp_path / "user.creds"
    creds.write_text(
        "-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n"
        "-----BEGIN USER NKEY SEED-----\nSUNOTASEED\n------END USER NKEY SEED------\n"
    )
    with pytest.raises(ValidationError) as caught:
        Settings(nats={"creds_file": str(creds)})
    line = _one_line(caught.value)
    assert "creds_file" in line and "holds no valid NKey seed" in line
    assert "SUNOTASEED" not in line


def test_nats_options_carry_the_login_and_a_verifying_tls_context(tmp_path):
    seed = new_user_seed()
    seed_file = tmp_path / "user.nk"
    seed_file.write_bytes(seed)
    creds = tmp_path / "user.creds"
    creds.write_text(creds_text("eyJ0.e30.sig", seed))
    assert connect_options(NatsSettings(user="u", password="p")) == {"user": "u", "password": "p"}
    assert connect_options(NatsSettings(token="t")) == {"token": "t"}
    assert connect_options(NatsSettings(creds_file=creds)) == {"user_credentials": str(creds)}
    assert connect_options(NatsSettings(nkey_seed_file=seed_file)) == {"nkeys_seed": str(seed_file)}
    context = connect_options(NatsSettings(url="tls://nats.example:4222"))["tls"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert "tls" not in connect_options(NatsSettings())


def test_a_nats_error_line_masks_the_url_password():
    settings = NatsSettings(url="nats://u:hunter22@127.0.0.1:4222")
    line = str(connect_error(settings, OSError("refused")))
    assert "hunter22" not in line and line.startswith("connect nats://u:")


def test_redis_clients_take_the_acl_login_and_tls_files(pem):
    settings = RedisSettings(
        url="rediss://127.0.0.1:6380/0",
        username="mailroom",
        password="pw",
        tls=TlsFiles(ca_file=pem, cert_file=pem, key_file=pem),
    )
    kwargs = sync_client(settings.url, settings).connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("mailroom", "pw")
    assert (kwargs["ssl_ca_certs"], kwargs["ssl_certfile"], kwargs["ssl_keyfile"]) == (
        str(pem),
        str(pem),
        str(pem),
    )
    assert kwargs["ssl_cert_reqs"] == "required"
    assert "ssl_ca_certs" not in link_options("redis://127.0.0.1/0", settings)


async def test_the_async_redis_client_and_the_broker_take_the_same_options(pem):
    from actors.broker.build import build_broker

    settings = Settings(
        broker={"kind": "redis"},
        redis={"url": "rediss://127.0.0.1:6380/0", "username": "u", "password": "pw"},
    )
    client = async_client(settings.redis.url, settings.redis)
    assert client.connection_pool.connection_kwargs["username"] == "u"
    await client.aclose()
    broker = build_broker(settings)
    kwargs = broker.client.connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"], kwargs["ssl_cert_reqs"]) == (
        "u",
        "pw",
        "required",
    )
    broker.client.close()


def test_postgres_tls_settings_reach_every_connection_as_libpq_parameters(pem):
    settings = DatabaseSettings(
        url="postgresql+psycopg://mailroom:pw@db.example/mailroom",
        sslmode="verify-full",
        tls=TlsFiles(ca_file=pem, cert_file=pem, key_file=pem),
    )
    url = database_url(settings)
    assert "sslmode=verify-full" in url and f"sslrootcert={pem}".replace("/", "%2F") in url
    dsn = libpq_dsn(url)
    assert dsn.startswith("postgresql://mailroom:pw@db.example/mailroom?")
    assert "sslcert=" in dsn and "sslkey=" in dsn
    engine = create_engine(settings)
    assert engine.url.query["sslmode"] == "verify-full"
    assert engine.url.query["sslrootcert"] == str(pem)
    assert database_url(DatabaseSettings()) == DatabaseSettings().url


def test_s3_verification_reaches_boto3(pem):
    from mailroom.adapters.storage.s3 import S3Store

    for settings, expected in (
        (StorageSettings(kind="s3", s3_endpoint_url="https://s3.example"), True),
        (
            StorageSettings(kind="s3", s3_endpoint_url="https://s3.example", s3_ca_file=pem),
            str(pem),
        ),
        (StorageSettings(kind="s3", s3_endpoint_url="https://s3.example", s3_verify=False), False),
    ):
        store = S3Store(settings)
        assert store._client._endpoint.http_session._verify == expected
        store.close()


def test_a_postgres_password_setting_reaches_the_url_and_is_a_secret():
    settings = DatabaseSettings(
        url="postgresql+psycopg://mailroom@db.example/mailroom", password="p@ss"
    )
    assert database_url(settings) == "postgresql+psycopg://mailroom:p%40ss@db.example/mailroom"
    assert "p@ss" not in repr(settings) and "p@ss" in secret_values(Settings(database=settings))
    with pytest.raises(ValidationError, match="url carries a password and password is set too"):
        DatabaseSettings(url="postgresql+psycopg://u:pw@db.example/mailroom", password="other")
