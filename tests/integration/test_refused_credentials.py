"""A process whose NATS server refuses its credentials says so in one line and exits 2.

The rule of every long-running process: a refused login at the start is a
configuration error, not an outage to wait out. The NATS bridge and the reference
recognizer stop at once with one ERROR line naming the server and the login
(never the password) and exit status 2, so a supervisor shows them failing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from bridges.nats import EXIT_LOGIN_REFUSED, NatsBridge
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
