"""Sample mails for ``mailroom dev``: CSV, XLSX and text documents, and one broken file."""

from __future__ import annotations

import io
import uuid
from email.message import EmailMessage

Attachment = tuple[str, str, bytes]

XLSX_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def build_mail(subject: str, attachments: list[Attachment], *, sender: str) -> bytes:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = "intake@mailroom.test"
    message["Subject"] = subject
    message["Message-ID"] = f"<{uuid.uuid4().hex}@mailroom.test>"
    message.set_content(f"{subject}: see the attached documents.\n")
    for name, media_type, data in attachments:
        maintype, subtype = media_type.split("/", 1)
        message.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
    return message.as_bytes()


def _xlsx(rows: list[list[object]]) -> bytes:
    from openpyxl import Workbook

    book = Workbook()
    sheet = book.active
    assert sheet is not None
    for row in rows:
        sheet.append(row)
    buffer = io.BytesIO()
    book.save(buffer)
    return buffer.getvalue()


def invoice_csv(number: int) -> bytes:
    return (
        "invoice_number,supplier,total,currency\n"
        f"INV-{number:04d},Acme Supplies,{100 + number}.50,EUR\n"
    ).encode()


def invoice_mails(start: int, count: int, *, tag: str = "Invoice") -> list[bytes]:
    """``count`` mails numbered from ``start``, each with one CSV invoice (subject ``{tag} {n}``)."""
    return [
        build_mail(
            f"{tag} {n}",
            [(f"invoice-{n}.csv", "text/csv", invoice_csv(n))],
            sender=f"supplier{n}@example.test",
        )
        for n in range(start, start + count)
    ]


def sample_mails() -> list[bytes]:
    """Five mails a new user can follow from IMAP to notification."""
    return [
        build_mail(
            "Invoice March",
            [("invoice-0001.csv", "text/csv", invoice_csv(1))],
            sender="Acme Billing <billing@acme.test>",
        ),
        build_mail(
            "Quarterly rates",
            [
                (
                    "rates.xlsx",
                    XLSX_TYPE,
                    _xlsx([["invoice_number", "total", "supplier"], ["INV-0002", 240.0, "Globex"]]),
                )
            ],
            sender="Globex <accounts@globex.test>",
        ),
        build_mail(
            "Delivery note",
            [
                (
                    "note.txt",
                    "text/plain",
                    b"Invoice number: INV-0003\nTotal: 99.90\nSupplier: Initech\n",
                )
            ],
            sender="Initech <shipping@initech.test>",
        ),
        build_mail(
            "Scanned form (broken)",
            [("form.xlsx", XLSX_TYPE, b"PK\x03\x04 not a workbook")],
            sender="Umbrella <office@umbrella.test>",
        ),
        build_mail("Hello, no attachments", [], sender="Friend <friend@example.test>"),
    ]
