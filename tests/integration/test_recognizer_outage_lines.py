"""The reference recognizer tells a NATS outage once per back-off step, without tracebacks."""

from __future__ import annotations

import logging
from functools import partial

import pytest

from mailroom.devtools.stack import free_port
from mailroom.errors import NatsUnavailable
from mailroom.process.outage import OutageLog
from mailroom.recognizer import connect as recognizer_connect
from mailroom.settings import NatsSettings

pytestmark = pytest.mark.integration


async def test_a_nats_server_that_is_not_there_is_one_line_not_one_per_try(caplog, monkeypatch):
    # Eight tries a tenth of a second apart, on a clock that stands still: all of them in the
    # first back-off step, however slow the machine.
    monkeypatch.setattr(recognizer_connect, "MAX_RECONNECT_ATTEMPTS", 8)
    monkeypatch.setattr(recognizer_connect, "RECONNECT_WAIT_S", 0.1)
    monkeypatch.setattr(recognizer_connect, "OutageLog", partial(OutageLog, clock=lambda: 0.0))
    url = f"nats://127.0.0.1:{free_port()}"
    settings = NatsSettings(url=url, allow_anonymous=True, connect_timeout_s=0.5)

    async def closed() -> None:
        pass

    with caplog.at_level(logging.INFO), pytest.raises(NatsUnavailable):
        await recognizer_connect.connect(settings, name="outage-test", on_closed=closed)

    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split(" (")[0] for r in lines] == [f"NATS {url} is unreachable"]
    assert lines[0].exc_info is None
