"""Stage counters and per-process CPU for whole-system benchmarks (``bench/e2e.py``).

``StageSampler`` reads, once a second, how many of a run's mails each stage has
passed (from Postgres, and the webhook sink's arrivals), so a drain shows which
stage is the slowest; ``ProcessCpu`` sums user + system CPU of each Mailroom
process and its children (Dramatiq forks its workers) for a CPU cost per mail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
import psycopg

#: Each stage's count of mails whose subject starts with a prefix (``%s``).
STAGE_SQL = """
SELECT
  (SELECT count(*) FROM inbound_mail m WHERE m.subject LIKE %(p)s),
  (SELECT count(*) FROM recognition_job j JOIN stored_file f ON f.id = j.file_id
     JOIN inbound_mail m ON m.id = f.mail_id
     WHERE m.subject LIKE %(p)s AND j.published_at IS NOT NULL),
  (SELECT count(*) FROM recognition_job j JOIN stored_file f ON f.id = j.file_id
     JOIN inbound_mail m ON m.id = f.mail_id
     WHERE m.subject LIKE %(p)s AND (j.started_at IS NOT NULL OR j.finished_at IS NOT NULL)),
  (SELECT count(*) FROM recognition_job j JOIN stored_file f ON f.id = j.file_id
     JOIN inbound_mail m ON m.id = f.mail_id
     WHERE m.subject LIKE %(p)s AND j.finished_at IS NOT NULL),
  (SELECT count(*) FROM document d JOIN stored_file f ON f.id = d.file_id
     JOIN inbound_mail m ON m.id = f.mail_id WHERE m.subject LIKE %(p)s),
  (SELECT count(*) FROM channel_message c JOIN inbound_mail m ON m.id = c.mail_id
     WHERE m.subject LIKE %(p)s)
"""
STAGES = ("stored", "published", "acked", "applied", "documents", "notified", "delivered")


@dataclass
class StageSampler:
    """Samples the stage counts of mails with a subject prefix in a thread."""

    dsn: str
    prefix: str
    delivered: Callable[[], int]
    interval_s: float = 1.0
    samples: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> StageSampler:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="stages", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(STAGE_SQL, {"p": f"{self.prefix}%"}).fetchone()
                assert row is not None
                counts = (*(int(v) for v in row), self.delivered())
                self.samples.append((time.monotonic() - self.started, counts))
                self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def report(self, total: int) -> list[str]:
        """One line per stage: when it started and finished, and its rate meanwhile."""
        lines = []
        for index, stage in enumerate(STAGES):
            first = next((t for t, c in self.samples if c[index] > 0), None)
            done = next((t for t, c in self.samples if c[index] >= total), None)
            last_t, last_c = self.samples[-1] if self.samples else (0.0, (0,) * len(STAGES))
            end = done if done is not None else last_t
            count = total if done is not None else last_c[index]
            span = max(end - (first or 0.0), 1e-9)
            rate = count / span if first is not None else 0.0
            lines.append(
                f"  {stage:<10} first at {first or 0:6.1f}s, all at "
                f"{'-' if done is None else f'{done:6.1f}s'}, {rate:7.1f} mails/s while running"
            )
        return lines

    def timeline(self, every_s: float = 10.0) -> list[str]:
        """The counts every ``every_s`` seconds, to see a stage fall behind."""
        lines, next_t = [], 0.0
        for t, counts in self.samples:
            if t >= next_t:
                lines.append(f"  {t:6.1f}s " + " ".join(f"{n:6d}" for n in counts))
                next_t = t + every_s
        return ["  time    " + " ".join(f"{s[:6]:>6}" for s in STAGES), *lines]


class ProcessCpu:
    """User + system CPU seconds of processes and their children, by label."""

    def __init__(self, pids: dict[str, int], own: dict[str, int] | None = None) -> None:
        self.pids = pids
        self.own = own or {}  # without children (this process: its children are the others)
        self.base = self.read()

    def _tree(self, pid: int, *, children: bool = True) -> float:
        try:
            root = psutil.Process(pid)
            total = 0.0
            for proc in [root, *(root.children(recursive=True) if children else [])]:
                times = proc.cpu_times()
                total += times.user + times.system
                if children:  # children that exited (Postgres backends) and were waited for
                    total += times.children_user + times.children_system
            return total
        except psutil.NoSuchProcess:
            return 0.0

    def read(self) -> dict[str, float]:
        cpu = {label: self._tree(pid) for label, pid in self.pids.items()}
        cpu.update({label: self._tree(pid, children=False) for label, pid in self.own.items()})
        return cpu

    def since_start(self) -> dict[str, float]:
        now = self.read()
        return {label: now[label] - self.base.get(label, 0.0) for label in now}
