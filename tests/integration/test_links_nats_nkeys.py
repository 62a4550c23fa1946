"""NATS logins by NKey seed and by creds file (user JWT + seed) on real nats-servers: the keys
and JWTs are made here with the ``nkeys`` package, so no ``nsc`` is needed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailroom.adapters.nats import NatsClient, OutgoingMessage
from mailroom.errors import NatsUnavailable
from mailroom.settings import NatsSettings
from tests.fixtures.links import (
    ConfiguredNats,
    JwtAuth,
    jwt_auth,
    new_seed,
    new_user_seed,
    public_key,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def nkey_seed() -> bytes:
    return new_user_seed()


@pytest.fixture(scope="module")
def nkey_nats(
    nkey_seed: bytes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConfiguredNats]:
    folder = tmp_path_factory.mktemp("nats-nkey")
    config = folder / "nats.conf"
    config.write_text(f"authorization {{ users = [ {{ nkey: {public_key(nkey_seed)} }} ] }}\n")
    server = ConfiguredNats(folder, config, {}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def jwt_setup() -> JwtAuth:
    return jwt_auth()


@pytest.fixture(scope="module")
def jwt_nats(
    jwt_setup: JwtAuth, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConfiguredNats]:
    folder = tmp_path_factory.mktemp("nats-jwt")
    config = folder / "nats.conf"
    config.write_text(jwt_setup.server_config)
    server = ConfiguredNats(folder, config, {}).start()
    yield server
    server.stop()


def _settings(server: ConfiguredNats, **login: object) -> NatsSettings:
    return NatsSettings(
        url=server.url_for(),
        jetstream=False,
        connect_timeout_s=1.0,
        reconnect_wait_s=0.1,
        initial_connect_attempts=1,
        subject_prefix="login.",
        **login,
    )


async def _round_trip(settings: NatsSettings) -> list[bytes]:
    client = NatsClient(settings, name="link-test")
    await client.connect()
    try:
        watch = await client.watch(settings.subject("probe"))
        await client.publish(OutgoingMessage(settings.subject("probe"), b"signed in", "m1"))
        received = await asyncio.wait_for(watch.fetch(1, 2.0), 5.0)
        await watch.close()
    finally:
        await client.close()
    return [m.data for m in received]


async def _connect_error(settings: NatsSettings) -> str:
    client = NatsClient(settings, name="link-test")
    with pytest.raises(NatsUnavailable) as caught:
        await client.connect()
    await client.close()
    return str(caught.value)


def _write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


async def test_the_adapter_logs_in_with_its_nkey_seed(nkey_nats, nkey_seed, tmp_path):
    seed_file = _write(tmp_path / "user.nk", nkey_seed)
    assert await _round_trip(_settings(nkey_nats, nkey_seed_file=seed_file)) == [b"signed in"]


async def test_an_unknown_nkey_is_one_line_without_the_seed(nkey_nats, tmp_path):
    other = new_user_seed()
    message = await _connect_error(
        _settings(nkey_nats, nkey_seed_file=_write(tmp_path / "other.nk", other))
    )
    assert "NATS refused the login (nkey)" in message
    assert "\n" not in message and other.decode() not in message


async def test_the_adapter_logs_in_with_a_creds_file(jwt_nats, jwt_setup, tmp_path):
    creds = _write(tmp_path / "user.creds", jwt_setup.user_creds(new_user_seed()))
    assert await _round_trip(_settings(jwt_nats, creds_file=creds)) == [b"signed in"]


async def test_a_user_jwt_from_an_untrusted_account_is_one_line(jwt_nats, jwt_setup, tmp_path):
    seed = new_user_seed()
    creds = jwt_setup.user_creds(seed, signed_by=new_seed("account"))
    message = await _connect_error(
        _settings(jwt_nats, creds_file=_write(tmp_path / "stranger.creds", creds))
    )
    assert "NATS refused the login (creds file)" in message
    assert "\n" not in message and seed.decode() not in message
