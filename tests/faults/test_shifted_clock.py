"""One worker's clock is two minutes ahead: it steals no lease and times out no job.

Leases, reply deadlines and retry times are written by one process and compared
by another; they all come from the database's ``now()`` (``mailroom/db/clock.py``).
Here a second worker runs with its wall clock 120 s ahead (``shifted_clock/``),
beside a worker with the right time. With each process's own clock, the shifted
worker would take over every lease the other holds (its IDLE wait keeps one
for seconds) and its watchdog would time out every job the other published.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

import pytest

from mailroom.devtools.seed import invoice_mails

pytestmark = pytest.mark.faults

SHIFTED_CLOCK = Path(__file__).parent / "shifted_clock"
SHIFT_S = 120
MAILS = 6

SETTINGS = {
    # Answers take a while, so jobs wait in `processing` past many watchdog passes...
    "MAILROOM_RECOGNIZER__DELAY_S": "3",
    # ...whose deadline is well within the shift: a 120 s-ahead watchdog would expire them.
    "MAILROOM_RECOGNITION__REPLY_DEADLINE_S": "60",
    "MAILROOM_SCHEDULER__WATCHDOG_INTERVAL_S": "0.5",
}

#: What a worker logs when it takes a live lease for an expired one, or loses its own.
LEASE_TROUBLE = ("taking over the expired lease", "lease lost")


def test_a_worker_two_minutes_ahead_steals_no_lease_and_times_out_no_job(make_system):
    system = make_system(**SETTINGS)
    system.start_all()
    started = time.time()
    # The sweeps (the watchdog among them) and polls; only the right clock publishes jobs.
    ahead = system.start(
        "worker-intake",
        label="worker-ahead",
        extra_args=["--queues", "maintenance"],
        env={
            "PYTHONPATH": os.pathsep.join([str(SHIFTED_CLOCK), system.env["PYTHONPATH"]]),
            "SHIFTED_CLOCK_S": str(SHIFT_S),
        },
    )
    system.append(*invoice_mails(1, MAILS))
    recognized = "SELECT count(*) FROM stored_file WHERE status = 'RECOGNIZED'"
    system.wait_for("every file recognized", lambda: system.scalar(recognized) == MAILS, 90)

    jobs = dict(system.query("SELECT status, count(*) FROM recognition_job GROUP BY 1"))
    assert jobs == {"done": MAILS}, "no job timed out early"
    assert ahead.running, "the shifted worker ran the whole time"
    logs = {log.name: log.read_text(errors="replace") for log in system.logs.glob("*.log")}
    # The shift was in force in that worker: its log lines carry its time.
    first = datetime.strptime(logs["worker-ahead.log"][:19], "%Y-%m-%d %H:%M:%S")
    assert first.timestamp() - started > SHIFT_S - 30
    for name, text in logs.items():
        for trouble in LEASE_TROUBLE:
            assert trouble not in text, f"{name}: {trouble}"
