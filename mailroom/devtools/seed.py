"""Sample mails for ``mailroom dev``: CSV, XLSX and text documents, documents inside a forwarded
mail and a winmail.dat, and one broken file."""

from __future__ import annotations

import io
import uuid
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default

from mailroom.devtools.tnef import make_winmail

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


def forwarded_mail(subject: str, inner: bytes, *, sender: str) -> bytes:
    """A mail forwarding ``inner`` as an attachment (a message/rfc822 part), as clients do."""
    message = EmailMessage()
    message["From"] = sender
    message["To"] = "intake@mailroom.test"
    message["Subject"] = subject
    message["Message-ID"] = f"<{uuid.uuid4().hex}@mailroom.test>"
    message.set_content("Forwarding this one, see below.\n")
    message.add_attachment(message_from_bytes(inner, policy=default), filename="forwarded.eml")
    return message.as_bytes()


def winmail_mail(subject: str, attachments: list[tuple[str, bytes]], *, sender: str) -> bytes:
    """A mail as Outlook sends it in rich-text mode: its files inside one winmail.dat."""
    winmail = make_winmail(attachments)
    return build_mail(subject, [("winmail.dat", "application/ms-tnef", winmail)], sender=sender)


def forwarded_invoice(number: int) -> bytes:
    """Invoice ``number`` as a CSV in a mail that someone forwarded."""
    original = build_mail(
        f"Invoice {number}",
        [(f"invoice-{number}.csv", "text/csv", invoice_csv(number))],
        sender=f"supplier{number}@example.test",
    )
    return forwarded_mail(f"Fwd: Invoice {number}", original, sender="clerk@mailroom.test")


def winmail_invoice(number: int) -> bytes:
    """Invoice ``number`` as a CSV inside a winmail.dat."""
    return winmail_mail(
        f"Invoice {number}",
        [(f"invoice-{number}.csv", invoice_csv(number))],
        sender=f"supplier{number}@example.test",
    )


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
        forwarded_invoice(4),
        winmail_invoice(5),
    ]
