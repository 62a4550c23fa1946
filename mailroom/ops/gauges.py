"""Prometheus gauges of the work that waits: read from Postgres when Prometheus scrapes.

A custom collector rather than gauges set by a loop: the figures are as fresh as the
scrape, and nothing runs between scrapes. The scheduler registers it and exports it
only while it leads, so one process answers and a sum over instances counts each item
once (workers would multiply it by their number). Each scrape opens one short
connection with a statement timeout: a slow database costs a scrape, never a hang.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import psycopg
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from psycopg.rows import dict_row

from mailroom.ops.attention import (
    NEEDS_OPERATOR,
    NEEDS_OPERATOR_SQL,
    OLDEST_SQL,
    STAGES,
    needs_operator_row,
    oldest_row,
)

logger = logging.getLogger(__name__)

#: Longest a scrape's queries may run, in milliseconds.
STATEMENT_TIMEOUT_MS = 2_000
#: Longest wait for the scrape's connection, in seconds.
CONNECT_TIMEOUT_S = 2

#: Every metric this collector exports (the deploy rules test checks them).
METRIC_NAMES = (
    "mailroom_needs_operator",
    "mailroom_stage_oldest_age_seconds",
    "mailroom_state_up",
)


class WorkStateCollector(Collector):
    """Items waiting for an operator and the oldest item per stage, read on each scrape."""

    def __init__(self, dsn: str, *, active: Callable[[], bool] = lambda: True) -> None:
        self.dsn = dsn
        #: Export only while this returns True (the scheduler: while it leads).
        self.active = active

    def describe(self) -> list[Metric]:
        # NOTE: without describe() the registry would call collect() (and query) on register.
        return []

    def collect(self) -> Iterator[Metric]:
        if not self.active():
            return
        up = GaugeMetricFamily(
            "mailroom_state_up", "1 when the last scrape could read the work state from Postgres."
        )
        try:
            counts, oldest = self._read()
        except psycopg.Error as exc:
            logger.warning("Work state gauges: Postgres did not answer: %s", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        waiting = GaugeMetricFamily(
            "mailroom_needs_operator",
            "Final items that wait for an operator (current attempts only), by item.",
            labels=["item"],
        )
        for item in NEEDS_OPERATOR:
            waiting.add_metric([item], counts[item])
        yield waiting
        ages = GaugeMetricFamily(
            "mailroom_stage_oldest_age_seconds",
            "Age of the oldest item waiting in each stage (0 when the stage is empty).",
            labels=["stage"],
        )
        for stage in STAGES:
            ages.add_metric([stage], oldest[stage] or 0.0)
        yield ages

    def _read(self) -> tuple[dict[str, int], dict[str, float | None]]:
        with psycopg.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
            row_factory=dict_row,
        ) as conn:
            counts = conn.execute(NEEDS_OPERATOR_SQL).fetchone()
            oldest = conn.execute(OLDEST_SQL).fetchone()
        assert counts is not None and oldest is not None  # aggregates always give a row
        return needs_operator_row(counts), oldest_row(oldest)
