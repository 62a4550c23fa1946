"""A mail in, a notification out: the real processes on real servers.

50 mails with one CSV each are appended over IMAP; each must become exactly one
document and one delivered notification per route (log and webhook), with no
duplicate side effect: the webhook sink sees each Idempotency-Key once.
"""

from __future__ import annotations

import pytest

from mailroom.devseed import invoice_mails

pytestmark = pytest.mark.e2e

MAILS = 50


def _done(system, mails: int) -> bool:
    delivered = system.scalar("SELECT count(*) FROM channel_message WHERE status = 'delivered'")
    return delivered >= 2 * mails


def _assert_each_mail_once(system, mails: int) -> None:
    assert system.scalar("SELECT count(*) FROM inbound_mail") == mails
    assert system.scalar("SELECT count(DISTINCT uid) FROM inbound_mail") == mails
    assert system.scalar("SELECT count(*) FROM inbound_mail WHERE status = 'final'") == mails
    assert system.scalar("SELECT count(*) FROM stored_file WHERE status = 'RECOGNIZED'") == mails
    assert system.scalar("SELECT count(*) FROM document") == mails
    rows = system.query("SELECT channel, status, count(*) FROM channel_message GROUP BY 1, 2")
    assert sorted(rows) == [("log", "delivered", mails), ("webhook", "delivered", mails)]
    # The sink dedupes on Idempotency-Key: every notification arrived, none twice.
    received = system.webhook.record.items
    assert len({item.key for item in received}) == mails
    assert [item for item in received if item.duplicate] == []
    invoices = system.query("SELECT fields ->> 'invoice_number' FROM document")
    assert len({number for (number,) in invoices}) == mails


def test_fifty_mails_become_documents_and_delivered_notifications(make_system):
    system = make_system()
    system.start_all()
    system.append(*invoice_mails(1, MAILS))
    took = system.wait_for("50 mails delivered", lambda: _done(system, MAILS), timeout_s=180)
    _assert_each_mail_once(system, MAILS)
    print(f"{MAILS} mails → documents → notifications in {took:.1f}s")
