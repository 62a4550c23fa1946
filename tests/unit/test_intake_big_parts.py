"""Big mails: their big part bodies are read from the raw bytes, never through the parser,
and a part over the attachment limit is measured from its base64 length, never decoded whole."""

from __future__ import annotations

import random
import tracemalloc
from email.message import EmailMessage

import pytest

from mailroom.intake import big_parts, mime_parts
from mailroom.intake.big_parts import MIN_MAIL_BYTES, base64_size, elide_big_bodies
from mailroom.intake.parsing import Limits, parse_mail

MIB = 1024 * 1024


def _mail(*parts: tuple[str, str, bytes]) -> bytes:
    message = EmailMessage()
    message["From"] = "Sender <sender@example.com>"
    message["Subject"] = "scans"
    message["Message-ID"] = "<big@example.com>"
    message.set_content("see attached\n")
    for name, media_type, data in parts:
        maintype, subtype = media_type.split("/", 1)
        message.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
    return message.as_bytes().replace(b"\n", b"\r\n")


def _pdf(size: int) -> bytes:
    return b"%PDF-1.7\n" + random.Random(size).randbytes(size - 9)


def test_a_part_over_the_limit_is_measured_and_typed_but_never_decoded(monkeypatch):
    data = _pdf(3 * MIB)
    raw = _mail(("scan.pdf", "application/pdf", data), ("rates.csv", "text/csv", b"a,b\n1,2\n"))

    def never(*args):
        raise AssertionError("a part over the limit was decoded whole")

    monkeypatch.setattr(big_parts, "decode_base64", never)
    tracemalloc.start()
    try:
        parsed = parse_mail(raw, Limits(2 * MIB, 50 * MIB, 10))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    scan, rates = parsed.attachments
    assert (scan.name, scan.size, scan.data, scan.file_type) == ("scan.pdf", len(data), b"", "pdf")
    assert scan.skip_reason == f"attachment of {len(data)} bytes exceeds the limit of {2 * MIB}"
    assert (rates.data, rates.skip_reason) == (b"a,b\n1,2\n", None)
    assert parsed.subject == "scans" and parsed.message_id == "<big@example.com>"
    # Neither the 4 MB of base64 nor the 3 MB it stands for were ever held.
    assert peak < MIB, f"parsing held {peak} bytes at its peak"


def test_a_big_part_under_the_limit_reads_the_same_bytes_as_the_parser_would():
    data = _pdf(2 * MIB)
    raw = _mail(("scan.pdf", "application/pdf", data))
    assert elide_big_bodies(raw) is not None, "the run is cut out of the parser's text"
    (scan,) = parse_mail(raw, Limits(3 * MIB, 50 * MIB, 10)).attachments
    assert (scan.data, scan.size, scan.skip_reason) == (data, len(data), None)


@pytest.mark.parametrize("size", [MIB, MIB + 1, MIB + 2])
def test_the_size_of_a_base64_run_is_told_exactly_from_its_length(size):
    raw = _mail(("blob.bin", "application/octet-stream", _pdf(size)))
    elided = elide_big_bodies(raw)
    assert elided is not None
    (span,) = elided.spans
    assert base64_size(raw, span) == size


def test_text_that_only_looks_like_base64_is_put_back_whole():
    # A 7bit body of hex lines: no character the run scan stops at, but not base64.
    lines = b"".join(b"%064x\r\n" % n for n in range(MIN_MAIL_BYTES // 60))
    raw = (
        b"From: a@example.com\r\nSubject: hex\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/mixed; boundary=B\r\n\r\n--B\r\nContent-Type: text/plain\r\n"
        b"\r\nhello\r\n--B\r\nContent-Type: application/octet-stream\r\n"
        b'Content-Disposition: attachment; filename="hex.txt"\r\n\r\n' + lines + b"--B--\r\n"
    )
    (part,) = parse_mail(raw, Limits(10 * MIB, 50 * MIB, 10)).attachments
    assert part.data == lines[:-2] and part.size == len(lines) - 2


def test_a_forwarded_mail_with_a_big_attachment_is_stored_with_its_own_bytes():
    data = _pdf(2 * MIB)
    inner = EmailMessage()
    inner["Subject"] = "forwarded"
    inner.set_content("inner\n")
    inner.add_attachment(data, maintype="application", subtype="pdf", filename="inner.pdf")
    outer = EmailMessage()
    outer["Subject"] = "fwd"
    outer.set_content("see forwarded\n")
    outer.add_attachment(inner)
    raw = outer.as_bytes().replace(b"\n", b"\r\n")
    container, pdf = parse_mail(raw, Limits(5 * MIB, 50 * MIB, 10)).attachments
    assert b"ELIDED" not in container.data and len(container.data) > len(data)
    assert pdf.data == data and pdf.parent == 0


def test_in_a_small_mail_too_a_part_over_the_limit_is_sized_from_its_base64(monkeypatch):
    data = _pdf(5000)
    raw = _mail(("scan.pdf", "application/pdf", data), ("rates.csv", "text/csv", b"a,b\n1,2\n"))
    read = mime_parts.payload
    decoded: list[str] = []

    def payload(part):
        decoded.append(part.get_content_type())
        return read(part)

    monkeypatch.setattr(mime_parts, "payload", payload)
    scan, rates = parse_mail(raw, Limits(1000, 50 * MIB, 10)).attachments
    assert (scan.size, scan.data, scan.file_type) == (len(data), b"", "pdf")
    assert "application/pdf" not in decoded, "the part over the limit was decoded"
    assert rates.data == b"a,b\n1,2\n"
