"""A mail in, a notification out: the real processes on real servers.

50 mails with one CSV each are appended over IMAP (one of them forwarded, one inside a
winmail.dat, as real mailboxes hold them); each must become exactly one document and one
delivered notification per route (log and webhook), with no duplicate side effect: the
webhook sink sees each Idempotency-Key once.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mailroom.devtools.seed import forwarded_invoice, invoice_mails, winmail_invoice
from mailroom.devtools.stack import free_port

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
    # The forwarded CSV and the one in winmail.dat were recognized as files of their containers.
    extracted = system.query(
        """SELECT f.source_path, f.status, c.status, d.fields ->> 'invoice_number'
             FROM stored_file AS f
             JOIN stored_file AS c ON c.id = f.parent_file_id
             JOIN document AS d ON d.file_id = f.id
            ORDER BY f.source_path"""
    )
    assert extracted == [
        (
            f"forwarded.eml/invoice-{mails - 1}.csv",
            "RECOGNIZED",
            "CONTAINER",
            f"INV-{mails - 1:04d}",
        ),
        (f"winmail.dat/invoice-{mails}.csv", "RECOGNIZED", "CONTAINER", f"INV-{mails:04d}"),
    ]


def _worker_metrics(port: int) -> dict[str, float]:
    """The worker's Prometheus exposition as {sample with labels: value}."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def test_fifty_mails_become_documents_and_delivered_notifications(make_system, tmp_path):
    metrics_port = free_port()
    system = make_system(
        MAILROOM_BROKER__PROMETHEUS="true",
        MAILROOM_BROKER__PROMETHEUS_PORT=str(metrics_port),
        dramatiq_prom_db=str(tmp_path / "prometheus"),  # this test's own multiprocess folder
    )
    system.start_all()
    system.append(
        *invoice_mails(1, MAILS - 2), forwarded_invoice(MAILS - 1), winmail_invoice(MAILS)
    )
    took = system.wait_for("50 mails delivered", lambda: _done(system, MAILS), timeout_s=180)
    _assert_each_mail_once(system, MAILS)
    print(f"{MAILS} mails → documents → notifications in {took:.1f}s")

    # The worker's exporter joins Dramatiq's counters and the delivery pipeline's own.
    metrics = _worker_metrics(metrics_port)
    assert metrics["mailroom_delivery_delivered_total{account=default,channel=webhook}"] == MAILS
    assert metrics["mailroom_delivery_delivered_total{account=default,channel=log}"] == MAILS
    delivered_by_dramatiq = [
        value
        for name, value in metrics.items()
        if name.startswith("dramatiq_messages_total{") and "actor_name=deliver_channel" in name
    ]
    assert delivered_by_dramatiq and sum(delivered_by_dramatiq) >= 1
