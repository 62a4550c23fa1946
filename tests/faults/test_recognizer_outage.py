"""The recognizer is down longer than the no-ack window: the gate holds, nothing is failed.

With the harness's short timings (a 20 s no-ack window, the gate closing after 10 s
of silence) the gate closes before any job runs out of republishes, so no job is
dead-lettered, no file ends ERROR, and each mail is notified once when the
recognizer is back.
"""

from __future__ import annotations

import time

import pytest

from mailroom.devtools.seed import invoice_mails

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]

WARM_UP = 2
DURING_OUTAGE = 6
#: Longer than the harness's no-ack window (5 s x 4).
OUTAGE_S = 35


def _count(system, sql: str) -> int:
    return int(system.scalar(sql))


def test_a_recognizer_down_longer_than_the_no_ack_window_is_held_not_failed(make_system):
    system = make_system(MAILROOM_SCHEDULER__OUTBOX_SWEEP_INTERVAL_S="0.5")
    system.start_all()
    system.append(*invoice_mails(1, WARM_UP))
    recognized = "SELECT count(*) FROM stored_file WHERE status = 'RECOGNIZED'"
    system.wait_for("warm-up", lambda: _count(system, recognized) == WARM_UP, timeout_s=120)

    system.kill("recognizer")
    killed = time.monotonic()
    system.append(*invoice_mails(1 + WARM_UP, DURING_OUTAGE))
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - killed)))
    assert _count(system, "SELECT count(*) FROM recognition_job WHERE status = 'dlq'") == 0
    system.start("recognizer", label="recognizer-2")

    total = WARM_UP + DURING_OUTAGE
    system.wait_for("every file recognized", lambda: _count(system, recognized) == total, 90)
    jobs = dict(system.query("SELECT status, count(*) FROM recognition_job GROUP BY 1"))
    assert jobs == {"done": total}

    def one_recognized_notification_each() -> bool:
        rows = system.query("SELECT body FROM channel_message")
        return len(rows) == 2 * total and all("RECOGNIZED" in body for (body,) in rows)

    system.wait_for("the notifications", one_recognized_notification_each, timeout_s=30)
    assert not system.query("SELECT id FROM channel_message WHERE body LIKE '%%ERROR%%'")
