"""A broker outage is reported once per back-off step, and its end once."""

from __future__ import annotations

import logging

from actors.broker.outage import (
    ConsumerErrorFilter,
    OutageReport,
    describe_redis,
    describe_redis_pool,
)
from mailroom.adapters.redis_client import sync_client
from mailroom.settings import RedisSettings


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _reports(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "actors.broker.outage"]


def test_failures_are_reported_once_per_growing_step(caplog):
    clock = _Clock()
    report = OutageReport("redis://db:6379/0", max_interval_s=30, clock=clock)
    with caplog.at_level(logging.INFO, logger="actors.broker.outage"):
        # Failures every half second for two minutes, from many threads
        while clock.now < 120:
            report.failed("Error 111 connecting to db:6379. Connection refused.")
            clock.now += 0.5

    lines = _reports(caplog)
    # Reported at 0, 4, 12, 28, 58, 88, 118 s: steps 4, 8, 16, then the 30 s cap
    assert len(lines) == 7
    assert lines[0] == (
        "Broker redis://db:6379/0 is unreachable (Error 111 connecting to db:6379. "
        "Connection refused.); consumers keep retrying, next report in 4 s"
    )


def test_recovery_is_reported_once_and_restarts_the_steps(caplog):
    clock = _Clock()
    report = OutageReport("redis://db:6379/0", clock=clock)
    with caplog.at_level(logging.INFO, logger="actors.broker.outage"):
        report.recovered()
        report.failed("down")
        report.recovered()
        report.recovered()
        report.failed("down again")

    assert _reports(caplog) == [
        "Broker redis://db:6379/0 is unreachable (down); consumers keep retrying, next report in 4 s",
        "Broker redis://db:6379/0 is reachable again",
        "Broker redis://db:6379/0 is unreachable (down again); consumers keep retrying, "
        "next report in 4 s",
    ]


def test_consumer_connection_errors_and_their_restart_lines_go_to_the_report():
    report = OutageReport("redis://db:6379/0")
    consumer_filter = ConsumerErrorFilter(report)

    def record(msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("dramatiq.worker.ConsumerThread(q)", 50, "", 0, msg, args, None)

    error = record("Consumer encountered a connection error: %s", "refused")
    restart = record("Restarting consumer in %0.2f seconds.", 3.0)
    assert consumer_filter.filter(error) is False
    assert report.down
    assert consumer_filter.filter(restart) is False
    # A restart after another kind of error still shows
    assert consumer_filter.filter(record("Consumer encountered an unexpected error.")) is True
    assert consumer_filter.filter(restart) is True


def test_the_broker_is_named_by_host_and_port_with_the_password_masked():
    assert (
        describe_redis({"username": None, "password": "pw", "host": "r", "port": 6380, "db": 2})
        == "redis://:***@r:6380/2"
    )
    assert describe_redis({"username": "u", "host": "r", "port": 6379}) == "redis://u@r:6379/0"


def test_a_sentinel_broker_is_named_by_its_master_and_sentinels():
    settings = RedisSettings(
        url="redis://ignored:1/2",
        sentinels=["10.0.0.1:26379", "10.0.0.2:26379"],
        sentinel_master="mailroom",
    )
    client = sync_client(settings.url, settings)  # connects lazily: nothing is reached here
    try:
        assert describe_redis_pool(client.connection_pool) == (
            "redis sentinel master mailroom db 2 (sentinels 10.0.0.1:26379,10.0.0.2:26379)"
        )
    finally:
        client.close()
