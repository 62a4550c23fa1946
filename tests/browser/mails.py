"""The browser tests' mails: invoices whose CSV lacks the required total, so each file waits
for a person, and a scanned page. Each test's mails come from a sender domain of its own, which keeps its files
apart in the one queue the tests share (the console filters on the sender)."""

from __future__ import annotations

import csv
import io
import random
import struct
import zlib

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


def scanned_page(width: int = 480, height: int = 240) -> bytes:
    """A PNG of a printed page as a scanner sends it: lines of speckled "text" on white.

    The speckle (seeded, so the same each run) keeps it from compressing below the size
    under which intake takes an image for a logo or a signature, not a document.
    """
    speckle = random.Random(7)
    rows = []
    for y in range(height):
        line = y % 24 < 12 and 16 <= y < height - 16
        end = width - 16 - (y // 24 % 3) * 60
        row = bytes(
            speckle.choice((40, 90, 160)) if line and 16 <= x < end else 255 for x in range(width)
        )
        rows.append(b"\x00" + row)  # each row starts with its filter type, none

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


def browser_test_mails() -> dict[str, list[bytes]]:
    """Every test's mails, by the sender domain its files are found by; every file but the
    scan's needs a check (the reference recognizer reads no text from an image, and a
    ``generic`` document needs no field)."""
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
        "conflict.test": [invoice_without_total(7401, sender="billing@conflict.test")],
        "scan.test": [
            build_mail(
                "Scanned delivery note",
                [("delivery-note.png", "image/png", scanned_page())],
                sender="Scanner <scanner@scan.test>",
            )
        ],
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
