"""Every metric the alert rules and the dashboard in deploy/ use is one a process exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import prometheus_client
import pytest
import yaml
from prometheus_client.core import Metric

from mailroom.ops.gauges import METRIC_NAMES, WorkStateCollector

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
#: A metric name in a PromQL expression: ours and Dramatiq's share these prefixes.
METRIC = re.compile(r"\b(?:mailroom|dramatiq)_[a-z0-9_]+\b")
#: The series prometheus-client writes for each family type.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gauge": ("",),
}


def _alert_exprs() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "mailroom.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def _series(families: Iterable[Metric]) -> set[str]:
    return {
        family.name + suffix for family in families for suffix in SUFFIXES.get(family.type, ("",))
    }


class _FixedState(WorkStateCollector):
    def _read(self) -> tuple[dict[str, int], dict[str, float | None]]:
        from mailroom.ops.attention import NEEDS_OPERATOR, STAGES

        return dict.fromkeys(NEEDS_OPERATOR, 0), dict.fromkeys(STAGES, None)


def _dramatiq_series(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names Dramatiq's exporter serves, from the registry its middleware builds."""
    from dramatiq.middleware.prometheus import Prometheus

    registries: list[prometheus_client.CollectorRegistry] = []

    class Recording(prometheus_client.CollectorRegistry):
        def __init__(self) -> None:
            super().__init__()
            registries.append(self)

    # The middleware points these at its folder: put them back afterwards.
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("prometheus_multiproc_dir", raising=False)
    monkeypatch.setattr(prometheus_client, "CollectorRegistry", Recording)
    Prometheus().after_process_boot(None)
    return _series(family for registry in registries for family in registry.collect())


def exported_series(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    # The modules that define the counters of the bridges, the scheduler and the workers.
    import bridges.nats  # noqa: F401
    import scheduling.metrics  # noqa: F401

    ours = _series(prometheus_client.REGISTRY.collect())
    gauges = _series(_FixedState("unused").collect())
    return ours | gauges | _dramatiq_series(monkeypatch)


def test_every_metric_of_the_alert_rules_and_the_dashboard_is_exported(monkeypatch):
    exprs = _alert_exprs() + _dashboard_exprs()
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    assert {"mailroom_needs_operator", "dramatiq_message_rejects_total"} <= used
    assert used - exported_series(monkeypatch) == set()


def test_the_work_state_gauges_are_in_the_rules():
    used = {name for expr in _alert_exprs() for name in METRIC.findall(expr)}
    assert set(METRIC_NAMES) <= used


def test_every_alert_has_a_summary_and_a_severity():
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["alert"].startswith("Mailroom")
            assert rule["labels"]["severity"] in ("info", "warning", "critical")
            assert rule["annotations"]["summary"]


def test_both_causes_of_held_recognition_have_an_alert():
    used = {name for expr in _alert_exprs() for name in METRIC.findall(expr)}
    assert {"mailroom_recognition_gate_closed", "mailroom_recognition_answers_unread"} <= used
