"""The scheduler and the NATS bridge tell an outage once per back-off step, without tracebacks."""

from __future__ import annotations

import asyncio
import logging

import redis.exceptions

from bridges.nats import NatsBridge
from mailroom.errors import NatsUnavailable
from mailroom.process import outage
from mailroom.process.outage import OutageLog
from mailroom.settings import Settings
from scheduling.jobs import PeriodicJob
from scheduling.runner import _run_job


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING]


def test_the_scheduler_tells_a_broker_outage_once_per_step_and_its_end_once(caplog):
    clock = _Clock()
    log = OutageLog(
        "Broker redis://db:6379/0",
        logger=logging.getLogger("scheduling.runner"),
        doing="the jobs send again at each tick",
        max_interval_s=30,
        clock=clock,
    )

    def refused() -> None:
        raise redis.exceptions.ConnectionError("Error 111 connecting to db:6379. Refused.")

    down = PeriodicJob("outbox_sweep", 0.5, refused)
    with caplog.at_level(logging.INFO, logger="scheduling.runner"):
        while clock.now < 120:  # a tick every half second for two minutes
            _run_job(down, log)
            clock.now += 0.5
        _run_job(PeriodicJob("outbox_sweep", 0.5, lambda: None), log)
        _run_job(PeriodicJob("outbox_sweep", 0.5, lambda: None), log)

    records = _lines(caplog, "scheduling.runner")
    # At 0, 4, 12, 28, 58, 88 and 118 s, then once back: 8 lines for 240 failed sends.
    assert len(records) == 8
    assert records[0].getMessage() == (
        "Broker redis://db:6379/0 is unreachable (job outbox_sweep: ConnectionError: "
        "Error 111 connecting to db:6379. Refused.); the jobs send again at each tick, "
        "next report in 4 s"
    )
    assert records[-1].getMessage() == "Broker redis://db:6379/0 is reachable again"
    assert all(r.exc_info is None for r in records), "an expected outage has no traceback"


def test_debug_keeps_the_traceback_of_an_outage(caplog, monkeypatch):
    monkeypatch.setattr(outage, "show_tracebacks", True)
    log = OutageLog("NATS nats://n:4222", logger=logging.getLogger("test.outage"))
    with caplog.at_level(logging.INFO, logger="test.outage"):
        try:
            raise NatsUnavailable("connect nats://n:4222: ConnectionRefusedError")
        except NatsUnavailable as exc:
            log.failed(exc, exc=exc)
    [record] = _lines(caplog, "test.outage")
    assert record.exc_info is not None


class _DownClient:
    """A NATS client that cannot connect ``failures`` times, then subscribes."""

    jetstream = True

    def __init__(self, failures: int, bridge: list[NatsBridge]) -> None:
        self.failures = failures
        self.bridge = bridge

    async def connect(self) -> None:
        if self.failures:
            self.failures -= 1
            raise NatsUnavailable("connect nats://n:4222: ConnectionRefusedError")

    async def subscribe_results(self):
        bridge = self.bridge[0]

        class _Quiet:
            async def fetch(self, batch: int, timeout_s: float) -> list:
                bridge.stop()
                return []

            async def close(self) -> None:
                pass

        return _Quiet()

    async def close(self) -> None:
        pass

    async def drain(self) -> None:
        pass


def test_the_nats_bridge_tells_an_outage_once_per_step_and_its_end_once(caplog, monkeypatch):
    settings = Settings(nats={"url": "nats://n:4222"})
    holder: list[NatsBridge] = []
    bridge = NatsBridge(_DownClient(240, holder), lambda items: None, settings=settings)
    holder.append(bridge)
    clock = _Clock()
    bridge.nats_outage.clock = clock
    bridge.nats_outage.max_interval_s = 30

    async def pause() -> None:  # each failed try is half a second later than the one before
        clock.now += 0.5

    monkeypatch.setattr(bridge, "_pause", pause)
    with caplog.at_level(logging.INFO, logger="bridges.nats"):
        assert asyncio.run(bridge.run()) == 0

    messages = [r.getMessage() for r in _lines(caplog, "bridges.nats")]
    assert len(messages) == 8, messages
    assert messages[0] == (
        "NATS nats://n:4222 is unreachable (cannot subscribe: connect nats://n:4222: "
        "ConnectionRefusedError); retrying, next report in 4 s"
    )
    assert messages[-1] == "NATS nats://n:4222 is reachable again"
