"""Every MIME part of a mail is accounted for: a file, a skipped file with its reason, or body."""

from __future__ import annotations

import base64
import email
from email.message import Message
from email.mime.application import MIMEApplication
from email.mime.base import MIMEBase
from email.mime.message import MIMEMessage
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mailroom.intake.parsing import Limits, parse_mail

LIMITS = Limits(max_attachment_bytes=100_000, max_mail_bytes=10_000_000, max_attachments=500)
CSV = b"invoice,total\nA-1,10\n"


def _invoice_mail() -> MIMEMultipart:
    inner = MIMEMultipart()
    inner["Subject"], inner["From"] = "invoice", "billing@example.com"
    inner.attach(MIMEText("the invoice"))
    csv = MIMEApplication(CSV, "csv")
    csv.add_header("Content-Disposition", "attachment", filename="invoice.csv")
    inner.attach(csv)
    return inner


def _outer(*parts: Message) -> bytes:
    mail = MIMEMultipart()
    mail["Subject"], mail["From"], mail["Message-ID"] = "Fwd: invoice", "a@example.com", "<f@x>"
    mail.attach(MIMEText("see the forwarded mail"))
    for part in parts:
        mail.attach(part)
    return mail.as_bytes()


def test_an_inline_forwarded_mail_without_a_name_is_opened():
    forwarded = MIMEMessage(_invoice_mail())
    forwarded.add_header("Content-Disposition", "inline")
    container, invoice = parse_mail(_outer(forwarded), LIMITS).attachments
    assert (container.name, container.container_reason, container.check_reason) == (
        "attachment-1.eml",
        "forwarded mail: 1 file extracted",
        None,
    )
    assert (invoice.path, invoice.pipeline, invoice.data) == (
        "attachment-1.eml/invoice.csv",
        "tabular",
        CSV,
    )


def test_a_base64_forwarded_mail_is_decoded_and_opened():
    inner = _invoice_mail().as_bytes()
    forwarded = MIMEBase("message", "rfc822")
    forwarded["Content-Transfer-Encoding"] = "base64"
    forwarded.set_payload(base64.encodebytes(inner).decode())
    container, invoice = parse_mail(_outer(forwarded), LIMITS).attachments
    assert container.data == inner, "the container is stored decoded, as a mail"
    assert container.container_reason == "forwarded mail: 1 file extracted"
    assert (invoice.name, invoice.pipeline, invoice.data) == ("invoice.csv", "tabular", CSV)


def test_a_forwarded_mail_with_no_file_waits_for_an_operator():
    text_only = MIMEText("just text")
    text_only["Subject"] = "FW: prices"
    forwarded = MIMEMessage(text_only)
    (container,) = parse_mail(_outer(forwarded), LIMITS).attachments
    assert container.skip_reason is None
    assert container.check_reason == "forwarded mail: no file inside it, only text"


def test_unnamed_inline_binary_and_document_text_are_files_other_text_is_body():
    pdf = MIMEApplication(b"%PDF-1.4 x", "pdf")
    pdf.add_header("Content-Disposition", "inline")
    csv = MIMEText("a,b\n1,2\n", "csv")
    calendar = MIMEText("BEGIN:VCALENDAR", "calendar")
    parsed = parse_mail(_outer(pdf, csv, calendar), LIMITS)
    assert [(a.name, a.section) for a in parsed.attachments] == [
        ("attachment-1.pdf", "2"),
        ("attachment-2.csv", "3"),
    ]
    assert parsed.body_parts == ["1", "4"]


# --- Property: over generated MIME trees, every leaf is accounted for exactly once. ---

_LEAF_TYPES = [
    ("text", "plain"),
    ("text", "html"),
    ("text", "csv"),
    ("text", "calendar"),
    ("application", "pdf"),
    ("application", "octet-stream"),
    ("application", "zip"),
    ("image", "png"),
    ("message", "delivery-status"),
]
_DISPOSITIONS = [None, "inline", "attachment"]


@st.composite
def _leaf(draw: st.DrawFn) -> Message:
    maintype, subtype = draw(st.sampled_from(_LEAF_TYPES))
    payload = draw(st.binary(max_size=64))
    if maintype == "text":
        part: Message = MIMEText(payload.decode("latin-1"), subtype, "utf-8")
    elif maintype == "message":
        part = email.message_from_string(
            "Content-Type: message/delivery-status\n\nReporting-MTA: dns; mx.example.com\n\n"
            "Final-Recipient: rfc822; a@example.com\nAction: failed\n"
        )
    else:
        part = MIMEBase(maintype, subtype)
        part.set_payload(base64.encodebytes(payload).decode())
        part["Content-Transfer-Encoding"] = "base64"
    disposition = draw(st.sampled_from(_DISPOSITIONS))
    name = draw(st.one_of(st.none(), st.sampled_from(["a.pdf", "b.csv", "c.bin", "Ü x.png"])))
    if disposition or name:
        params = {"filename": name} if name else {}
        part.add_header("Content-Disposition", disposition or "attachment", **params)
    return part


def _tree(depth: int) -> st.SearchStrategy[Message]:
    if depth == 0:
        return _leaf()
    child = _tree(depth - 1)
    multipart = st.builds(
        _multipart,
        st.sampled_from(["mixed", "alternative", "related"]),
        st.lists(child, min_size=1, max_size=4),
    )
    forwarded = st.builds(_forward, child, st.sampled_from([None, "inline", "attachment"]))
    return st.one_of(_leaf(), multipart, forwarded)


def _multipart(subtype: str, parts: list[Message]) -> Message:
    mail = MIMEMultipart(subtype)
    for part in parts:
        mail.attach(part)
    return mail


def _forward(inner: Message, disposition: str | None) -> Message:
    part = MIMEMessage(inner)
    if disposition:
        part.add_header("Content-Disposition", disposition)
    return part


def _sections(message: Message, prefix: str = "") -> list[str]:
    """The sections of the leaves of a whole mail, walking into attached mails (IMAP numbers)."""
    if message.get_content_maintype() == "multipart":
        return _part_sections(message, prefix.removesuffix("."))
    return _part_sections(message, f"{prefix}1")


def _part_sections(part: Message, section: str) -> list[str]:
    if part.get_content_maintype() == "multipart":
        found = []
        for number, child in enumerate(part.get_payload(), start=1):
            found += _part_sections(child, f"{section}.{number}" if section else str(number))
        return found
    if part.get_content_type() == "message/rfc822":
        (inner,) = part.get_payload()
        return [section, *_sections(inner, f"{section}.")]
    return [section]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tree(3))
def test_every_leaf_part_is_a_file_a_skipped_file_or_body_exactly_once(tree):
    mail = tree
    mail["Subject"], mail["Message-ID"] = "generated", "<g@x>"
    parsed = parse_mail(mail.as_bytes(), LIMITS)
    files = [a.section for a in parsed.attachments if a.skip_reason is None]
    skipped = [a.section for a in parsed.attachments if a.skip_reason is not None]
    assert all(
        a.skip_reason
        for a in parsed.attachments
        if a.pipeline is None and not (a.container_reason or a.check_reason)
    ), "a file that is no document says why"
    accounted = files + skipped + parsed.body_parts
    assert sorted(accounted) == sorted(_sections(mail))
    assert len(set(accounted)) == len(accounted), "no part counted twice"
