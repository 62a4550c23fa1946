"""An erased mail is never notified again: the real processes, IMAP, Postgres and both sinks.

Three invoices are delivered by webhook and by e-mail; one is erased (``mailroom intake
erase``) and the cursor moved back below it (``mailroom intake reset --uid 0``). The next
poll reads all three again: the erased one is skipped by its tombstone, the others by the
dedupe, and a fourth invoice is the only new notification either sink gets.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mailroom.db.migrate import PROJECT_ROOT
from mailroom.devtools.seed import invoice_mails
from mailroom.devtools.sinks import SmtpSink

pytestmark = pytest.mark.e2e


@pytest.fixture
def smtp():
    sink = SmtpSink().start()
    yield sink
    sink.stop()


def _mailroom(system, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "mailroom", *args],
        env=system.env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _settled(system, mails: int) -> bool:
    """``mails`` mails final and notified, every notification delivered."""
    notified = system.scalar(
        "SELECT count(*) FROM inbound_mail WHERE status = 'final' AND notified_at IS NOT NULL"
    )
    open_messages = system.scalar(
        "SELECT count(*) FROM channel_message WHERE status <> 'delivered'"
    )
    return notified >= mails and open_messages == 0


def test_an_erased_mail_read_again_after_a_reset_is_never_notified_again(make_system, smtp):
    routes = [
        {"channel": "webhook", "recipient": "finance"},
        {"channel": "email", "recipient": "ops@mailroom.test", "subject": "Mail {mail_subject}"},
    ]
    system = make_system(
        MAILROOM_DELIVERY__EMAIL_ACCOUNTS=json.dumps(
            {"default": {"host": "127.0.0.1", "port": smtp.port, "security": "plain"}}
        ),
        MAILROOM_DELIVERY__ROUTES=json.dumps(routes),
    )
    system.start_all()
    system.append(*invoice_mails(1, 3))
    system.wait_for("3 mails notified", lambda: _settled(system, 3), timeout_s=180)
    assert (len(system.webhook.received), len(smtp.received)) == (3, 3)
    erased = system.scalar("SELECT id FROM inbound_mail WHERE subject = 'Invoice 2'")

    said = _mailroom(system, "intake", "erase", "--mail", str(erased), "--operator", "dpo")
    assert f"erased mail {erased}: 1 file(s)" in said
    _mailroom(system, "intake", "reset", "e2e", "--uid", "0")
    (last,) = system.append(*invoice_mails(4, 1))
    system.wait_for("the fourth mail notified", lambda: _settled(system, 3), timeout_s=180)
    system.wait_for(
        "the cursor past the fourth mail",
        lambda: system.scalar("SELECT last_uid FROM mailbox_cursor") >= last,
        timeout_s=60,
    )
    system.wait_for("every notification settled", lambda: _settled(system, 3), timeout_s=180)

    subjects = system.query("SELECT subject FROM inbound_mail ORDER BY uid")
    assert subjects == [("Invoice 1",), ("Invoice 3",), ("Invoice 4",)]
    assert system.scalar("SELECT count(*) FROM channel_message") == 6, "two for each mail left"
    assert len(system.webhook.received) == 4 and len(smtp.received) == 4
    assert [r.subject for r in smtp.received].count("Mail Invoice 2") == 1, "before the erase"
