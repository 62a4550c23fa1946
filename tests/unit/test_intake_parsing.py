"""Parsing untrusted mail: headers, attachment discovery, safe names, types and limits."""

from __future__ import annotations

import pytest

from mailroom.intake.parsing import Limits, classify, clean_text, parse_mail, safe_name

LIMITS = Limits(max_attachment_bytes=10_000, max_mail_bytes=100_000, max_attachments=10)


def _multipart(*parts: bytes, headers: bytes = b"") -> bytes:
    body = b"".join(b"--B\r\n" + part + b"\r\n" for part in parts)
    return (
        b"From: Ann <ann@example.com>\r\nSubject: test\r\nMessage-ID: <m@x>\r\n"
        + headers
        + b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=B\r\n\r\n"
        + body
        + b"--B--\r\n"
    )


def test_headers_are_read_and_decoded():
    raw = _multipart(
        b"Content-Type: text/plain\r\n\r\nhello",
        headers=(
            b"Return-Path: <bounce@example.com>\r\n"
            b"Authentication-Results: a; spf=pass\r\nAuthentication-Results: b; dkim=pass\r\n"
        ),
    ).replace(b"Subject: test", b"Subject: =?utf-8?b?w4RyZ2Vy?= ok")
    parsed = parse_mail(raw, LIMITS)
    assert parsed.message_id == "<m@x>"
    assert parsed.sender == "ann@example.com"
    assert parsed.subject == "Ärger ok"
    assert parsed.return_path == "bounce@example.com"
    assert parsed.authentication_results == "a; spf=pass\nb; dkim=pass"
    assert parsed.attachments == [], "a text body is not an attachment"
    assert len(parsed.sha256) == 64 and parsed.size == len(raw)


def test_nested_multiparts_inline_named_parts_and_attached_mails_are_found():
    related = (
        b"Content-Type: multipart/related; boundary=R\r\n\r\n"
        b"--R\r\nContent-Type: text/html\r\n\r\n<p>hi</p>\r\n"
        b'--R\r\nContent-Type: image/png\r\nContent-Disposition: inline; filename="logo.png"\r\n'
        b"Content-Transfer-Encoding: base64\r\n\r\niVBORw==\r\n--R--"
    )
    attached = (
        b"Content-Type: message/rfc822\r\nContent-Disposition: attachment\r\n\r\n"
        b"Subject: inner\r\n\r\ninner body"
    )
    parsed = parse_mail(_multipart(related, attached), LIMITS)
    names = [(a.name, a.file_type, a.pipeline) for a in parsed.attachments]
    assert names == [("logo.png", "png", "image"), ("attachment-2.eml", "eml", None)]
    assert parsed.attachments[0].data == b"\x89PNG"
    assert "under 4096" in parsed.attachments[0].skip_reason, "a 4-byte image is decoration"
    assert b"Subject: inner" in parsed.attachments[1].data
    assert parsed.attachments[1].container_reason == "forwarded mail: 0 files extracted"
    assert parsed.attachments[1].check_reason == "forwarded mail: no file inside it, only text"
    assert parsed.body_parts == ["1.1", "2.1"], "the HTML body and the forwarded text"


def test_inline_text_without_a_name_is_body_but_unnamed_binary_is_kept():
    parsed = parse_mail(
        _multipart(
            b"Content-Type: text/plain\r\nContent-Disposition: inline\r\n\r\nbody",
            b"Content-Type: application/pdf\r\n\r\n%PDF",
        ),
        LIMITS,
    )
    assert [(a.name, a.pipeline) for a in parsed.attachments] == [("attachment-1.pdf", "image")]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../../etc/passwd", "passwd"),
        ("..\\..\\boot.ini", "boot.ini"),
        ("/abs/path/report.csv", "report.csv"),
        ("..", "attachment-3.csv"),
        ("", "attachment-3.csv"),
        (None, "attachment-3.csv"),
        ("  . ", "attachment-3.csv"),
        ("a\x00b\x1fc\u202e.csv", "a b c .csv"),
        ("line\r\nbreak.csv", "line  break.csv"),
    ],
)
def test_safe_names_have_no_path_parts_or_control_characters(name, expected):
    assert safe_name(name, index=3, media_type="text/csv") == expected


def test_long_names_are_bounded_and_keep_their_extension():
    name = safe_name("x" * 1000 + ".xlsx", index=1, media_type="")
    assert len(name) == 200 and name.endswith(".xlsx")


@pytest.mark.parametrize(
    ("name", "media_type", "expected"),
    [
        ("a.CSV", "application/octet-stream", ("csv", "tabular")),
        ("a.tsv", "", ("tsv", "tabular")),
        ("a.xlsx", "", ("xlsx", "tabular")),
        ("a.xls", "", ("xls", "tabular")),
        ("a.pdf", "", ("pdf", "image")),
        ("a.png", "", ("png", "image")),
        ("a.jpg", "", ("jpeg", "image")),
        ("a.jpeg", "", ("jpeg", "image")),
        ("a.tif", "", ("tiff", "image")),
        ("a.tiff", "", ("tiff", "image")),
        ("note.txt", "text/plain", ("txt", "tabular")),
        ("noext", "image/jpeg", ("jpeg", "image")),
        ("a.docx", "text/csv", ("csv", "tabular")),
        ("noext", "application/zip", ("unknown", None)),
    ],
)
def test_file_types_come_from_the_extension_then_the_media_type(name, media_type, expected):
    assert classify(name, media_type)[:2] == expected


def test_limits_skip_big_and_surplus_attachments_and_drop_their_bytes():
    limits = Limits(max_attachment_bytes=10, max_mail_bytes=100_000, max_attachments=2)
    part = b'Content-Type: text/csv\r\nContent-Disposition: attachment; filename="%b"\r\n\r\n%b'
    parsed = parse_mail(
        _multipart(
            part % (b"big.csv", b"x" * 50), part % (b"ok.csv", b"a,b"), part % (b"3.csv", b"c")
        ),
        limits,
    )
    big, ok, third = parsed.attachments
    assert "exceeds the limit of 10" in big.skip_reason and big.data == b"" and big.size == 50
    assert ok.skip_reason is None and ok.data == b"a,b"
    assert "over the limit of 2" in third.skip_reason


def test_a_mail_over_the_limit_keeps_its_headers_and_is_not_parsed_further():
    parsed = parse_mail(b"Subject: x\r\n\r\n" + b"x" * 200, Limits(10, 100, 10))
    assert parsed.problem.startswith("mail of 214 bytes exceeds the limit of 100: oversize")
    assert parsed.subject == "x" and parsed.attachments == []


def test_clean_text_reads_raw_8bit_as_utf8_or_replacement_and_drops_controls():
    assert clean_text("caf\udce9") == "caf\ufffd"  # Latin-1 byte 0xE9: no charset says so
    assert clean_text("caf\udcc3\udca9") == "café"  # UTF-8 bytes of é
    assert clean_text("a\x00b\tc") == "a b c"
    assert clean_text("x" * 50, limit=10) == "x" * 10


def test_garbage_does_not_crash_the_parser():
    parsed = parse_mail(b"\xff\xfe\x00garbage\r\n\r\n\x00\x01", LIMITS)
    assert parsed.attachments == [] and parsed.message_id is None
