"""The browser tests' mails: invoices whose CSV lacks the required total, so each file waits
for a person. Each test's mails come from a sender domain of its own, which keeps its files
apart in the one queue the tests share (the console filters on the sender)."""

from __future__ import annotations

import csv
import io

from mailroom.devtools.seed import build_mail

#: Documents the queue test reviews.
QUEUE_LENGTH = 20

#: Markup an attacker puts into a mail's subject, sender name, file name and fields.
HOSTILE_SUBJECT = '<script>alert("subject")</script><img src=x onerror=alert("subject")>'
HOSTILE_NAME = "<b onmouseover=alert(1)>Mallory</b>"
HOSTILE_FILE = "<img src=x onerror=alert(2)>.csv"
HOSTILE_SUPPLIER = '<script>alert("field")</script>'


def invoice_without_total(
    number: int,
    *,
    sender: str,
    subject: str | None = None,
    name: str | None = None,
    supplier: str = "Acme Supplies",
) -> bytes:
    """A mail with one CSV invoice that names no ``total``: its document needs checking."""
    table = io.StringIO()
    writer = csv.writer(table, lineterminator="\n")
    writer.writerow(["invoice_number", "supplier", "currency"])
    writer.writerow([f"INV-{number:04d}", supplier, "EUR"])
    return build_mail(
        subject or f"Invoice {number}",
        [(name or f"invoice-{number}.csv", "text/csv", table.getvalue().encode())],
        sender=sender,
    )


def browser_test_mails() -> dict[str, list[bytes]]:
    """Every test's mails, by the sender domain its files are found by."""
    return {
        "correct.test": [
            invoice_without_total(
                7001, sender="Acme Billing <billing@correct.test>", subject="Invoice March"
            )
        ],
        "queue.test": [
            invoice_without_total(8000 + n, sender=f"Supplier {n} <billing{n}@queue.test>")
            for n in range(1, QUEUE_LENGTH + 1)
        ],
        "viewer.test": [invoice_without_total(7101, sender="billing@viewer.test")],
        "csrf.test": [invoice_without_total(7201, sender="billing@csrf.test")],
        "hostile.test": [
            invoice_without_total(
                7301,
                sender=f'"{HOSTILE_NAME}" <mallory@hostile.test>',
                subject=HOSTILE_SUBJECT,
                name=HOSTILE_FILE,
                supplier=HOSTILE_SUPPLIER,
            )
        ],
    }
