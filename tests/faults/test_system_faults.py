"""The whole system survives kill -9 of a worker and of the scheduler leader.

Nothing is lost and no side effect happens twice: every mail becomes one
document; every notification ends delivered (or ``uncertain`` for a log send
cut off mid-way, the one window that cannot be closed); the webhook sink sees
each Idempotency-Key, and a resend of the same key is the idempotent channel
doing its job.
"""

from __future__ import annotations

import pytest

from mailroom.devtools.seed import invoice_mails
from scheduling.leader import current_leader

pytestmark = pytest.mark.faults


def _settled(system, mails: int) -> bool:
    final = system.scalar(
        "SELECT count(*) FROM channel_message WHERE status IN ('delivered', 'uncertain')"
    )
    return final >= 2 * mails


def _assert_nothing_lost_nothing_twice(system, mails: int) -> None:
    assert system.scalar("SELECT count(DISTINCT uid) FROM inbound_mail") == mails
    assert system.scalar("SELECT count(*) FROM inbound_mail") == mails
    assert system.scalar("SELECT count(*) FROM stored_file WHERE status = 'RECOGNIZED'") == mails
    assert system.scalar("SELECT count(*) FROM document") == mails
    by_channel = dict(system.query("SELECT channel, count(*) FROM channel_message GROUP BY 1"))
    assert by_channel == {"log": mails, "webhook": mails}
    webhook = system.query(
        "SELECT status, count(*) FROM channel_message WHERE channel = 'webhook' GROUP BY 1"
    )
    assert webhook == [("delivered", mails)]
    assert len({item.key for item in system.webhook.received}) == mails
    log_states = dict(
        system.query(
            "SELECT status, count(*) FROM channel_message WHERE channel = 'log' GROUP BY 1"
        )
    )
    assert set(log_states) <= {"delivered", "uncertain"}


def test_a_worker_killed_midway_and_restarted_loses_nothing(make_system):
    system = make_system()
    system.start_all()
    system.append(*invoice_mails(1, 40))
    system.wait_for(
        "first documents", lambda: system.scalar("SELECT count(*) FROM document") >= 8, timeout_s=90
    )

    system.kill("worker")
    system.start("worker", label="worker-2")

    system.wait_for("every notification settled", lambda: _settled(system, 40), timeout_s=100)
    _assert_nothing_lost_nothing_twice(system, 40)


def test_the_standby_scheduler_takes_over_when_the_leader_is_killed(make_system):
    # Without IDLE, new mail is only read when the scheduler sends a poll.
    system = make_system(idle=False)
    for name in ("worker", "worker-intake", "bridge-nats", "bridge-stream", "recognizer"):
        system.start(name)
    first, second = system.start("scheduler"), system.start("scheduler", label="scheduler-2")
    key = int(system.env["MAILROOM_SCHEDULER__LEADER_LOCK_KEY"])

    def leader_pid() -> int | None:
        name = current_leader(system.dsn, key)
        return int(name.rsplit("-", 1)[1]) if name else None

    system.wait_for("a leader", lambda: leader_pid() is not None, timeout_s=30)
    leader = first if first.process and first.process.pid == leader_pid() else second
    system.append(*invoice_mails(1, 10))
    system.wait_for("first mails", lambda: _settled(system, 10), timeout_s=90)

    system.kill(leader.name)
    system.wait_for(
        "the standby leads", lambda: leader_pid() not in (None, leader.process.pid), timeout_s=10
    )
    system.append(*invoice_mails(11, 10))
    system.wait_for("mail after the failover", lambda: _settled(system, 20), timeout_s=90)
    _assert_nothing_lost_nothing_twice(system, 20)
