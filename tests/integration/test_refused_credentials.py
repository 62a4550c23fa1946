"""A process whose server refuses its credentials says so in one line and exits 2.

The rule of every long-running process (mailroom/process/logins.py): a refused
login at the start is a configuration error, not an outage to wait out. The NATS
bridge and the reference recognizer (NATS), the stream bridge, the scheduler and
the worker (Redis) stop at once with one line naming the server and the login
(never the password) and exit status 2, so a supervisor shows them failing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
import redis
from typer.testing import CliRunner

from bridges.nats import EXIT_LOGIN_REFUSED, NatsBridge
from bridges.stream import StreamBridge, create_client
from mailroom.adapters.nats import NatsClient
from mailroom.recognizer.faults import RecognizerFaults
from mailroom.recognizer.serve import _serve as serve
from mailroom.settings import NatsSettings, Settings
from tests.fixtures.links import ConfiguredNats

pytestmark = pytest.mark.integration

PASSWORD = "right-nats-password"
WRONG = "wrong-nats-password"
CONFIG = "authorization { users = [ { user: mailroom, password: $REFUSED_TEST_PASSWORD } ] }\n"


@pytest.fixture(scope="module")
def login_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfiguredNats]:
    folder = tmp_path_factory.mktemp("nats-login")
    config = folder / "nats.conf"
    config.write_text(CONFIG)
    server = ConfiguredNats(folder, config, {"REFUSED_TEST_PASSWORD": PASSWORD}).start()
    yield server
    server.stop()


def _settings(server: ConfiguredNats, tmp_path, password: str = WRONG) -> Settings:
    nats = NatsSettings(
        url=server.url_for(),
        jetstream=False,
        user="mailroom",
        password=password,
        connect_timeout_s=1.0,
        reconnect_wait_s=0.1,
        initial_connect_attempts=1,
    )
    return Settings(state_dir=tmp_path, nats=nats.model_dump())


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _assert_one_refusal_line(lines: list[str], server: ConfiguredNats) -> None:
    assert len(lines) == 1, lines
    assert f"connect {server.url_for()}: NATS refused the login (user 'mailroom')" in lines[0]
    assert WRONG not in lines[0] and PASSWORD not in lines[0]


async def test_the_nats_bridge_exits_2_in_one_line(login_nats, tmp_path, caplog):
    settings = _settings(login_nats, tmp_path)
    bridge = NatsBridge(NatsClient(settings.nats), lambda items: None, settings=settings)
    with caplog.at_level(logging.INFO):
        assert await bridge.run() == EXIT_LOGIN_REFUSED
    _assert_one_refusal_line(_errors(caplog), login_nats)


async def test_the_reference_recognizer_exits_2_in_one_line(login_nats, tmp_path, caplog):
    settings = _settings(login_nats, tmp_path)
    with caplog.at_level(logging.INFO):
        assert await serve(settings, RecognizerFaults()) == 2
    _assert_one_refusal_line(_errors(caplog), login_nats)


@pytest.fixture
def acl_user(redis_url: str):
    """A Redis ACL user, removed afterwards; the tests log in with a wrong password."""
    name, password = f"refused-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = redis.Redis.from_url(redis_url)
    admin.acl_setuser(name, enabled=True, passwords=[f"+{password}"], commands=["+@all"])
    yield name
    admin.acl_deluser(name)
    admin.close()


def _redis_refusing(redis_url: str, user: str, tmp_path, database_url: str) -> Settings:
    return Settings(
        state_dir=tmp_path,
        database={"url": database_url},
        broker={"kind": "redis"},
        redis={"url": redis_url, "username": user, "password": WRONG, "retry_attempts": 0},
    )


async def test_the_stream_bridge_exits_2_in_one_line(redis_url, acl_user, tmp_path, caplog):
    settings = _redis_refusing(redis_url, acl_user, tmp_path, "postgresql+psycopg://x@h/db")
    client = create_client(settings.stream_redis_url, settings.delivery, settings.redis)
    bridge = StreamBridge(client, settings=settings.delivery, send=lambda ids: None)
    try:
        with caplog.at_level(logging.INFO):
            assert await bridge.run() == 2
    finally:
        await client.aclose()
    [line] = _errors(caplog)
    assert "cannot start: Redis redis://" in line and "refused the login" in line
    assert WRONG not in line


@pytest.mark.timeout(30)
def test_the_scheduler_exits_2_in_one_line(redis_url, acl_user, database_url, tmp_path, caplog):
    from scheduling.runner import run

    settings = _redis_refusing(redis_url, acl_user, tmp_path, database_url)
    with caplog.at_level(logging.INFO):
        assert run(settings) == 2
    [line] = _errors(caplog)
    assert line.startswith(f"Scheduler cannot start: Redis redis://{acl_user}:")
    assert "refused the login" in line and WRONG not in line


@pytest.mark.timeout(30)
def test_the_worker_exits_2_in_one_line(redis_url, acl_user, database_url, monkeypatch):
    from mailroom.cli import app

    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("MAILROOM_BROKER__KIND", "redis")
    monkeypatch.setenv("MAILROOM_REDIS__URL", redis_url)
    monkeypatch.setenv("MAILROOM_REDIS__USERNAME", acl_user)
    monkeypatch.setenv("MAILROOM_REDIS__PASSWORD", WRONG)
    result = CliRunner().invoke(app, ["worker"])
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("mailroom worker: cannot start: Redis redis://")
    assert "refused the login" in line and WRONG not in line
