"""The NATS bridge is down longer than the no-ack window: every answer still wins.

While the bridge is down the recognizer's acks and results wait in JetStream;
the outbox runs out of republishes and dead-letters the jobs for NO_ACK. When
a bridge is back the held answers arrive and revive them (revive.py): no job
ends in ``dlq``, every file ends RECOGNIZED, and each mail's last notification
says so.
"""

from __future__ import annotations

import pytest

from mailroom.devtools.seed import invoice_mails

pytestmark = pytest.mark.faults

WARM_UP = 2
DURING_OUTAGE = 8

# A short no-ack window (1.5 s x 4 = 6 s), still at least twice the bridge's ack wait, as the
# settings require.
FAST_NO_ACK = {
    "MAILROOM_RECOGNITION__ACK_TIMEOUT_S": "1.5",
    "MAILROOM_RECOGNITION__MAX_REPUBLISH": "3",
    "MAILROOM_NATS__BRIDGE_ACK_WAIT_S": "3",
    "MAILROOM_SCHEDULER__OUTBOX_SWEEP_INTERVAL_S": "0.5",
}


def _count(system, sql: str) -> int:
    return int(system.scalar(sql))


def test_answers_held_in_jetstream_while_the_bridge_is_down_are_all_applied(make_system):
    system = make_system(**FAST_NO_ACK)
    system.start_all()
    system.append(*invoice_mails(1, WARM_UP))
    recognized = "SELECT count(*) FROM stored_file WHERE status = 'RECOGNIZED'"
    # Generous: on a loaded machine the processes alone can take most of a minute to start.
    system.wait_for("warm-up", lambda: _count(system, recognized) == WARM_UP, timeout_s=120)

    system.kill("bridge-nats")
    system.append(*invoice_mails(1 + WARM_UP, DURING_OUTAGE))
    # The defect's precondition: the outbox gave up on every job answered during the outage.
    system.wait_for(
        "jobs dead-lettered for NO_ACK during the outage",
        lambda: (
            _count(system, "SELECT count(*) FROM recognition_job WHERE error_code = 'NO_ACK'")
            == DURING_OUTAGE
        ),
        timeout_s=30,
    )

    system.start("bridge-nats", label="bridge-nats-2")
    total = WARM_UP + DURING_OUTAGE
    system.wait_for("every result applied", lambda: _count(system, recognized) == total, 60)

    jobs = dict(system.query("SELECT status, count(*) FROM recognition_job GROUP BY 1"))
    assert jobs == {"done": total}, "no job stays in dlq, and none was replayed"
    revived = "SELECT count(*) FROM recognition_job WHERE metrics ? 'revived'"
    assert _count(system, revived) >= DURING_OUTAGE
    assert _count(system, "SELECT count(*) FROM document") == total

    # Each mail's newest notification tells the final state: RECOGNIZED.
    def last_notifications_recognized() -> bool:
        rows = system.query(
            "SELECT DISTINCT ON (mail_id, channel) body FROM channel_message "
            "ORDER BY mail_id, channel, id DESC"
        )
        return len(rows) == 2 * total and all("RECOGNIZED" in body for (body,) in rows)

    system.wait_for("the final notifications", last_notifications_recognized, timeout_s=30)
