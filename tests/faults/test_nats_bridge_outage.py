"""The NATS bridge is down longer than the reply deadline: no verdict while answers wait unread.

While the bridge is down the recognizer's acks and results wait in the inbox's
JetStream consumer. The recognition gate holds every pipeline on that evidence
("answers unread"), so the outbox dead-letters nothing for NO_ACK and the
watchdog times nothing out; when a bridge is back the answers are applied and
each mail is notified once, as recognized. Before the gate looked at the
consumer, such an outage notified mails as failed first and as recognized after.
"""

from __future__ import annotations

import time

import pytest

from mailroom.devtools.seed import invoice_mails

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]

WARM_UP = 2
DURING_OUTAGE = 8
#: Short, so the outage outlasts both the reply deadline and the no-ack window (5 s x 4).
REPLY_DEADLINE_S = 15
#: Longer than the reply deadline and the no-ack window, with the watchdog's passes in it.
OUTAGE_S = 35


def _count(system, sql: str) -> int:
    return int(system.scalar(sql))


def test_a_bridge_down_longer_than_the_reply_deadline_sends_no_false_verdict(make_system):
    system = make_system(
        MAILROOM_RECOGNITION__REPLY_DEADLINE_S=str(REPLY_DEADLINE_S),
        MAILROOM_SCHEDULER__OUTBOX_SWEEP_INTERVAL_S="0.5",
    )
    system.start_all()
    system.append(*invoice_mails(1, WARM_UP))
    recognized = "SELECT count(*) FROM stored_file WHERE status = 'RECOGNIZED'"
    # Generous: on a loaded machine the processes alone can take most of a minute to start.
    system.wait_for("warm-up", lambda: _count(system, recognized) == WARM_UP, timeout_s=120)

    system.kill("bridge-nats")
    killed = time.monotonic()
    system.append(*invoice_mails(1 + WARM_UP, DURING_OUTAGE))
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - killed)))
    gates = system.query("SELECT reason FROM recognition_gate WHERE closed_at IS NOT NULL")

    system.start("bridge-nats", label="bridge-nats-2")
    total = WARM_UP + DURING_OUTAGE
    system.wait_for("every result applied", lambda: _count(system, recognized) == total, 90)

    jobs = dict(system.query("SELECT status, count(*) FROM recognition_job GROUP BY 1"))
    assert jobs == {"done": total}, "no job ended dlq or timeout, and none was replayed"
    revived = "SELECT count(*) FROM recognition_job WHERE metrics ? 'revived'"
    assert _count(system, revived) == 0, "no job needed reviving: none was ended"

    # Each mail is notified once per channel, as recognized.
    def one_recognized_notification_each() -> bool:
        rows = system.query("SELECT mail_id, channel, body FROM channel_message")
        return len(rows) == 2 * total and all("RECOGNIZED" in body for (_, _, body) in rows)

    system.wait_for("the notifications", one_recognized_notification_each, timeout_s=30)
    time.sleep(3)  # a late second notification would show here
    rows = system.query("SELECT mail_id, channel, body FROM channel_message")
    assert len(rows) == 2 * total
    assert not [body for (_, _, body) in rows if "ERROR" in body]
    # The gate said why it held: the bridge, not the recognition service.
    assert gates
    assert all(
        reason.startswith("answers unread: the NATS bridge is not consuming") for (reason,) in gates
    )
