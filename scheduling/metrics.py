"""Scheduler metrics, served on ``MAILROOM_METRICS__PORT``."""

from prometheus_client import Counter, Gauge

SENDS = Counter(
    "mailroom_scheduler_sends_total", "Messages the scheduler's jobs sent.", ["job", "outcome"]
)
LEADER = Gauge("mailroom_scheduler_leader", "1 while this scheduler process leads, else 0.")
