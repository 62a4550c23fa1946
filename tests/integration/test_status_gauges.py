"""The work-state gauges read real Postgres on each scrape: current work only, stage ages,
``mailroom_state_up`` 0 when Postgres does not answer, nothing while another scheduler leads."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mailroom.db.engine import libpq_dsn
from mailroom.devtools.stack import free_port
from mailroom.ops.gauges import WorkStateCollector
from tests.integration.test_status_operators import SEED

pytestmark = pytest.mark.integration


def _scrape(collector: WorkStateCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_gauges_count_current_work_and_age_each_stage(database_url):
    dsn = libpq_dsn(database_url)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SEED)
    samples = _scrape(WorkStateCollector(dsn))

    def waiting(item: str) -> float:
        return samples[("mailroom_needs_operator", (("item", item),))]

    def oldest(stage: str) -> float:
        return samples[("mailroom_stage_oldest_age_seconds", (("stage", stage),))]

    assert samples[("mailroom_state_up", ())] == 1
    assert waiting("jobs_dlq") == 1
    assert waiting("jobs_error") == 0  # the superseded attempt
    assert waiting("files_needs_check") == 1
    assert waiting("messages_uncertain") == 1
    assert waiting("cursors_blocked") == 1
    assert 1700 < oldest("recognition") < 2000
    assert 250 < oldest("delivery") < 400

    # The dlq job replayed into a new current attempt: it no longer waits for anyone.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE stored_file SET current_recognition_job_id = "
            "'00000000-0000-4000-8000-0000000000c1', status = 'PROCESSING' WHERE id = 10"
        )
    assert (
        _scrape(WorkStateCollector(dsn))[("mailroom_needs_operator", (("item", "jobs_dlq"),))] == 0
    )


def test_gauges_say_when_postgres_does_not_answer():
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/mailroom"
    samples = _scrape(WorkStateCollector(dsn))
    assert samples == {("mailroom_state_up", ()): 0}


def test_a_standby_scheduler_exports_no_gauges(database_url):
    samples = _scrape(WorkStateCollector(libpq_dsn(database_url), active=lambda: False))
    assert samples == {}


def test_the_scheduler_serves_the_gauges_while_it_leads(database_url):
    from prometheus_client import REGISTRY

    from mailroom.settings import Settings
    from scheduling.runner import SchedulerService, register_work_state

    settings = Settings(database={"url": database_url}, metrics={"port": 1})
    service = SchedulerService(settings)
    collector = register_work_state(settings, service)
    try:
        assert b"mailroom_needs_operator" not in generate_latest(REGISTRY)  # standing by
        service.is_leader.set()
        text = generate_latest(REGISTRY).decode()
        assert 'mailroom_needs_operator{item="jobs_dlq"} 0.0' in text
        assert "mailroom_state_up 1.0" in text
    finally:
        REGISTRY.unregister(collector)
