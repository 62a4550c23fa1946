"""A mail whose parsing kills the worker (``os._exit``) ends failed after the maximum.

Each attempt at parsing is counted in Postgres before it, so deaths that record
nothing still add up: after a death, the mailbox is read mail by mail, and after
``intake.max_retries`` more deaths at that mail the cursor blocks at its UID with
one ``intake.cursor_blocked`` event. The mails before it, in its poll too, are
stored and recognized; the mail after it waits behind it (per-mailbox order);
another mailbox served by the same workers, waiting in IDLE while they die, is
never blocked and its mails flow on.
"""

from __future__ import annotations

import json
import uuid

import pytest

from mailroom.devtools.imap import demo_mailbox
from mailroom.devtools.seed import build_mail, invoice_csv, invoice_mails
from tests.faults.dying_worker import DyingWorkers
from tests.faults.probe_actors import DIE_IN_PARSING

pytestmark = pytest.mark.faults

MAX_RETRIES = 2


def _mailbox(system, name: str, folder: str, *, idle: bool) -> dict[str, object]:
    imap = system.imap
    return {
        **demo_mailbox(name, imap.host, imap.port),
        "folder": folder,
        "idle": idle,
        "idle_timeout_s": 5,
        "batch_size": 25,
    }


def test_a_mail_that_kills_its_worker_blocks_its_mailbox_at_its_uid_and_the_rest_flows(
    make_system, imap_server, imap_folder
):
    other_folder = f"t{uuid.uuid4().hex[:10]}"
    imap_server.create_folder(other_folder)
    system = make_system(
        MAILROOM_INTAKE__MAX_RETRIES=str(MAX_RETRIES),
        # A dead worker's lease runs out before its replacement has started.
        MAILROOM_INTAKE__LEASE_S="2",
    )
    system.env["MAILROOM_INTAKE__MAILBOXES"] = json.dumps(
        [
            _mailbox(system, "e2e", imap_folder, idle=True),
            # Read by the same workers while they die (the scheduler's pass sends its polls).
            _mailbox(system, "e2e-b", other_folder, idle=True),
        ]
    )
    poison = build_mail(
        f"Invoice {DIE_IN_PARSING}",
        [("invoice-99.csv", "text/csv", invoice_csv(99))],
        sender="poison@example.test",
    )
    for name in ("bridge-nats", "recognizer", "scheduler"):
        system.start(name)
    workers = DyingWorkers(system).start()
    before = system.append(*invoice_mails(1, 2))

    def stored(count: int) -> bool:
        workers.check()
        return system.scalar("SELECT count(*) FROM inbound_mail") >= count

    system.wait_for("the mails before the poison stored", lambda: stored(2), timeout_s=60)
    # An innocent mail ahead of the poison, in the same poll as far as the server allows.
    ahead, poison_uid, _after = system.append(*invoice_mails(3, 1), poison, *invoice_mails(4, 1))
    imap_server.append(other_folder, *invoice_mails(11, 2))

    def cursor(name: str) -> tuple[object, ...] | None:
        rows = system.query(
            "SELECT status, blocked_uid, last_uid FROM mailbox_cursor WHERE mailbox = %s", name
        )
        return rows[0] if rows else None

    def blocked() -> bool:
        workers.check()
        state = cursor("e2e")
        return state is not None and state[0] == "blocked"

    system.wait_for("the poisoned mailbox blocked", blocked, timeout_s=90)
    recognized = "SELECT count(*) FROM stored_file WHERE status = 'RECOGNIZED'"

    def rest_recognized() -> bool:
        workers.check()
        return system.scalar(recognized) == 5

    system.wait_for("the other mails recognized", rest_recognized, timeout_s=60)

    assert cursor("e2e") == ("blocked", poison_uid, ahead)
    events = system.query(
        "SELECT detail->>'uid' FROM audit_event WHERE action = 'intake.cursor_blocked'"
    )
    assert events == [(str(poison_uid),)]
    mails = system.query(
        "SELECT c.mailbox, m.uid, m.status FROM inbound_mail AS m "
        "JOIN mailbox_cursor AS c ON c.id = m.cursor_id ORDER BY c.mailbox, m.uid"
    )
    assert [(box, status) for box, _, status in mails] == [
        ("e2e", "final"),
        ("e2e", "final"),
        ("e2e", "final"),
        ("e2e", "failed"),
        ("e2e-b", "final"),
        ("e2e-b", "final"),
    ], "the mail after the poison waits behind it; the other mailbox flows"
    assert [uid for box, uid, _ in mails if box == "e2e"] == [*before, ahead, poison_uid]
    other = cursor("e2e-b")
    assert other is not None and other[0] != "blocked" and other[1] is None, (
        "the other mailbox is never blocked"
    )
    assert MAX_RETRIES <= workers.deaths
    print(f"blocked at UID {poison_uid} after {workers.deaths} worker deaths")
