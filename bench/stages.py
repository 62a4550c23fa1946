"""Stage times and per-process CPU for whole-system benchmarks (``bench/e2e.py``).

``StageTimes`` reads, once the drain is over, when each of a run's mails passed each
stage — from the rows' own timestamps in Postgres, and the webhook sink's arrivals —
so a drain shows which stage is the slowest without loading the system it measures
(a query per second over the growing tables cost Postgres more CPU than the pipeline
did by the end of a 20,000-mail run). ``ProcessCpu`` sums user + system CPU of each
Mailroom process and its children (Dramatiq forks its workers) for a CPU cost per mail.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from dataclasses import dataclass, field

import psutil
import psycopg

#: Per mail whose subject starts with a prefix, the seconds after ``t0`` at which it was
#: stored, first published, acked (or answered without an ack), answered, mapped to a
#: document and notified: the first of each over the mail's jobs, files and messages.
STAGE_SQL = """
SELECT m.subject,
       EXTRACT(EPOCH FROM m.created_at - %(t0)s),
       EXTRACT(EPOCH FROM min(j.published_at) - %(t0)s),
       EXTRACT(EPOCH FROM min(COALESCE(j.started_at, j.finished_at)) - %(t0)s),
       EXTRACT(EPOCH FROM min(j.finished_at) - %(t0)s),
       EXTRACT(EPOCH FROM min(d.created_at) - %(t0)s),
       EXTRACT(EPOCH FROM min(c.created_at) - %(t0)s)
  FROM inbound_mail m
  LEFT JOIN stored_file f ON f.mail_id = m.id
  LEFT JOIN recognition_job j ON j.file_id = f.id
  LEFT JOIN document d ON d.file_id = f.id
  LEFT JOIN channel_message c ON c.mail_id = m.id
 WHERE m.subject LIKE %(p)s
 GROUP BY m.id
"""
STAGES = ("stored", "published", "acked", "applied", "documents", "notified", "delivered")


@dataclass
class StageTimes:
    """When each mail with a subject prefix passed each stage, in seconds from ``start``."""

    dsn: str
    prefix: str
    #: Per stage, the offsets of the mails that passed it, sorted.
    times: dict[str, list[float]] = field(default_factory=dict)

    def start(self) -> StageTimes:
        """Mark the start: the database's clock for the rows, this process's for arrivals."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        self.t0 = row[0]
        self.started = time.monotonic()
        return self

    def collect(self, arrivals: dict[str, float]) -> StageTimes:
        """Read the stage times (after the drain: one query, nothing while it runs)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(STAGE_SQL, {"p": f"{self.prefix}%", "t0": self.t0}).fetchall()
        columns = list(zip(*(row[1:] for row in rows), strict=True)) if rows else []
        self.times = {
            stage: sorted(float(t) for t in column if t is not None)
            for stage, column in zip(STAGES[:-1], columns, strict=False)
        }
        self.times["delivered"] = sorted(
            t - self.started for subject, t in arrivals.items() if subject.startswith(self.prefix)
        )
        return self

    def report(self, total: int) -> list[str]:
        """One line per stage: when it started and finished, and its rate meanwhile."""
        lines = []
        for stage in STAGES:
            times = self.times.get(stage, [])
            first = times[0] if times else None
            done = times[-1] if len(times) >= total else None
            end = done if done is not None else (times[-1] if times else 0.0)
            span = max(end - (first or 0.0), 1e-9)
            rate = min(len(times), total) / span if first is not None else 0.0
            lines.append(
                f"  {stage:<10} first at {first or 0:6.1f}s, all at "
                f"{'-' if done is None else f'{done:6.1f}s'}, {rate:7.1f} mails/s while running"
            )
        return lines

    def timeline(self, every_s: float = 10.0) -> list[str]:
        """The counts every ``every_s`` seconds, to see a stage fall behind."""
        last = max((times[-1] for times in self.times.values() if times), default=0.0)
        lines, t = [], 0.0
        while t <= last + every_s:
            counts = [bisect_right(self.times.get(stage, []), t) for stage in STAGES]
            lines.append(f"  {t:6.1f}s " + " ".join(f"{n:6d}" for n in counts))
            t += every_s
        return ["  time    " + " ".join(f"{s[:6]:>6}" for s in STAGES), *lines]


#: How the run's jobs and notifications ended: a backlog must not turn into republishes and
#: dead letters (flow control), nor into more notifications than mails.
OUTCOME_SQL = """
SELECT count(*),
       count(*) FILTER (WHERE j.metrics ->> 'republish_count' IS NOT NULL),
       count(*) FILTER (WHERE j.status = 'dlq' OR j.error_code = 'NO_ACK'),
       (SELECT count(*) FROM channel_message c JOIN inbound_mail m ON m.id = c.mail_id
         WHERE m.subject LIKE %(p)s)
  FROM recognition_job j JOIN stored_file f ON f.id = j.file_id
  JOIN inbound_mail m ON m.id = f.mail_id
 WHERE m.subject LIKE %(p)s
"""


def outcome_line(dsn: str, prefix: str) -> str:
    """One line: the run's jobs, those republished or dead-lettered, and its notifications."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(OUTCOME_SQL, {"p": f"{prefix}%"}).fetchone()
    assert row is not None
    jobs, republished, dead, notifications = (int(v) for v in row)
    return (
        f"outcome: {jobs} recognition jobs, {republished} republished, {dead} dead-lettered "
        f"(NO_ACK); {notifications} notifications"
    )


class ProcessCpu:
    """User + system CPU seconds of processes and their children, by label."""

    def __init__(self, pids: dict[str, int], own: dict[str, int] | None = None) -> None:
        self.pids = pids
        self.own = own or {}  # without children (this process: its children are the others)
        self.base = self.read()

    def _tree(self, pid: int, *, children: bool = True) -> float:
        try:
            root = psutil.Process(pid)
            tree = [root, *(root.children(recursive=True) if children else [])]
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for proc in tree:
            # One process that exits while it is read (a Postgres backend) drops out alone:
            # it must not zero its whole tree (that made Postgres's figure negative).
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
            if children:  # children that exited (Postgres backends) and were waited for
                total += times.children_user + times.children_system
        return total

    def read(self) -> dict[str, float]:
        cpu = {label: self._tree(pid) for label, pid in self.pids.items()}
        cpu.update({label: self._tree(pid, children=False) for label, pid in self.own.items()})
        return cpu

    def since_start(self) -> dict[str, float]:
        now = self.read()
        return {label: now[label] - self.base.get(label, 0.0) for label in now}


def machine_bound(cpu_s: float, items: int) -> tuple[float, int]:
    """Items per second ``cpu_s`` of CPU for ``items`` allows with every core of this
    process's machine busy, and that number of cores."""
    cores = len(os.sched_getaffinity(0))
    return (cores * items / cpu_s if cpu_s > 0 else float("inf")), cores
