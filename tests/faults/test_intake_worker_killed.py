"""kill -9 of the intake worker in the middle of a batch, then a new one: each mail once.

Postgres is slowed to 0.1 s per stored mail so the batch is surely mid-way when
the worker dies. Its lease then runs out (6 s here) and the scheduler's next
poll on the new worker reads on from the cursor. Mails the dead worker's
connection still committed are fenced by its lease and whole, so they are
neither lost nor stored again.
"""

from __future__ import annotations

import psycopg
import pytest

from mailroom.devtools.seed import invoice_mails

pytestmark = pytest.mark.faults

MAILS = 30


def test_a_worker_killed_mid_batch_and_replaced_stores_each_mail_once(make_system):
    system = make_system()
    with psycopg.connect(system.dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION slow_mail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "PERFORM pg_sleep(0.1); RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER slow BEFORE INSERT ON inbound_mail "
            "FOR EACH ROW EXECUTE FUNCTION slow_mail()"
        )
    system.start("worker-intake")
    system.start("scheduler")
    uids = system.append(*invoice_mails(1, MAILS))

    def stored() -> int:
        return system.scalar("SELECT count(*) FROM inbound_mail")

    system.wait_for("the batch under way", lambda: stored() >= 3, timeout_s=60)
    system.kill("worker-intake")
    at_kill = stored()
    assert at_kill < MAILS, "the batch was still running"
    system.start("worker-intake", label="worker-intake-2")

    system.wait_for("every mail stored", lambda: stored() >= MAILS, timeout_s=90)
    system.wait_for(
        "the cursor released",
        lambda: system.scalar("SELECT status FROM mailbox_cursor") == "idle",
        timeout_s=30,
    )
    assert system.query("SELECT uid FROM inbound_mail ORDER BY uid") == [(u,) for u in uids]
    assert system.scalar("SELECT count(*) FROM recognition_job") == MAILS
    assert system.scalar("SELECT count(*) FROM stored_object WHERE bucket_role = 'mail'") == MAILS
    assert system.scalar("SELECT last_uid FROM mailbox_cursor") == uids[-1]
    print(f"worker killed after {at_kill} of {MAILS} mails; all {MAILS} stored once")
