"""Real-world mail: forwarded and winmail.dat documents, inline images, types from bytes, charsets."""

from __future__ import annotations

from email.mime.application import MIMEApplication
from email.mime.image import MIMEImage
from email.mime.message import MIMEMessage
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

import pytest

from mailroom.devtools.tnef import make_winmail
from mailroom.intake.filetypes import classify
from mailroom.intake.parsing import Limits, parse_mail

LIMITS = Limits(max_attachment_bytes=100_000, max_mail_bytes=1_000_000, max_attachments=20)
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 5000


def _csv_part(name: str, data: bytes = b"invoice,total\nA-1,10\n") -> MIMEApplication:
    part = MIMEApplication(data, "csv")
    part.replace_header("Content-Type", "text/csv")
    part.add_header("Content-Disposition", "attachment", filename=name)
    return part


def _mail(*parts, subject: str = "fwd") -> MIMEMultipart:
    mail = MIMEMultipart()
    mail["Subject"], mail["From"], mail["Message-ID"] = subject, "a@example.com", "<m@x>"
    mail.attach(MIMEText("see below"))
    for part in parts:
        mail.attach(part)
    return mail


def _forwarded(inner: MIMEMultipart, *, as_eml_file: bool = False):
    if as_eml_file:
        part = MIMEApplication(inner.as_bytes(), "octet-stream")
        part.add_header("Content-Disposition", "attachment", filename="forwarded.eml")
        return part
    part = MIMEMessage(inner)
    part.add_header("Content-Disposition", "attachment", filename="forwarded.eml")
    return part


@pytest.mark.parametrize("as_eml_file", [False, True])
def test_a_forwarded_csv_is_extracted_with_its_path_and_the_mail_is_a_container(as_eml_file):
    inner = _mail(_csv_part("invoice.csv"))
    parsed = parse_mail(_mail(_forwarded(inner, as_eml_file=as_eml_file)).as_bytes(), LIMITS)
    container, invoice = parsed.attachments
    assert (container.name, container.file_type, container.pipeline) == (
        "forwarded.eml",
        "eml",
        None,
    )
    assert container.container_reason == "forwarded mail: 1 file extracted"
    assert container.data, "the container is stored too"
    assert (invoice.file_type, invoice.pipeline, invoice.skip_reason) == ("csv", "tabular", None)
    assert (invoice.parent, invoice.path) == (0, "forwarded.eml/invoice.csv")
    assert invoice.data == b"invoice,total\nA-1,10\n"


def test_a_csv_inside_winmail_dat_is_extracted():
    tnef = MIMEApplication(make_winmail([("invoice.csv", b"a,b\n1,2\n")]), "ms-tnef")
    tnef.add_header("Content-Disposition", "attachment", filename="winmail.dat")
    parsed = parse_mail(_mail(tnef).as_bytes(), LIMITS)
    container, invoice = parsed.attachments
    assert (container.file_type, container.container_reason) == (
        "tnef",
        "winmail.dat (TNEF): 1 file extracted",
    )
    assert (invoice.path, invoice.pipeline, invoice.data) == (
        "winmail.dat/invoice.csv",
        "tabular",
        b"a,b\n1,2\n",
    )


def test_broken_winmail_dat_is_kept_unopened_for_an_operator_with_the_reason():
    tnef = MIMEApplication(b"not a TNEF stream", "ms-tnef")
    tnef.add_header("Content-Disposition", "attachment", filename="winmail.dat")
    (container,) = parse_mail(_mail(tnef).as_bytes(), LIMITS).attachments
    assert container.container_reason is None and container.data
    assert container.skip_reason is None
    assert container.check_reason.startswith("winmail.dat (TNEF) could not be opened")


def test_forwarded_mails_are_opened_to_the_nesting_limit_only():
    mail = _mail(_csv_part("deep.csv"))
    for _ in range(5):
        mail = _mail(_forwarded(mail))
    parsed = parse_mail(mail.as_bytes(), Limits(100_000, 1_000_000, 20, max_nesting=3))
    paths = [a.path for a in parsed.attachments]
    assert paths == [
        "forwarded.eml",
        "forwarded.eml/forwarded.eml",
        "forwarded.eml/forwarded.eml/forwarded.eml",
        "forwarded.eml/forwarded.eml/forwarded.eml/forwarded.eml",
    ]
    assert "nested deeper than 3 levels" in parsed.attachments[-1].skip_reason
    assert all(a.pipeline is None for a in parsed.attachments)


def test_extracted_files_count_against_the_attachment_limit():
    inner = _mail(*[_csv_part(f"{i}.csv") for i in range(5)])
    parsed = parse_mail(_mail(_forwarded(inner)).as_bytes(), Limits(100_000, 1_000_000, 3))
    assert [a.skip_reason is None for a in parsed.attachments] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    assert parsed.attachments[-1].data == b""


def _logo_mail(*, referenced: bool) -> bytes:
    related = MIMEMultipart("related")
    html = '<p>Regards</p><img src="cid:logo-1@example.com">' if referenced else "<p>Regards</p>"
    related.attach(MIMEText(html, "html"))
    logo = MIMEImage(PNG, "png")
    logo.add_header("Content-ID", "<logo-1@example.com>")
    logo.add_header("Content-Disposition", "inline", filename="logo.png")
    related.attach(logo)
    return _mail(related).as_bytes()


def test_an_image_the_html_body_shows_by_content_id_is_stored_but_skipped():
    (logo,) = parse_mail(_logo_mail(referenced=True), LIMITS).attachments
    assert logo.data == PNG and logo.pipeline == "image"
    assert "referenced by Content-ID" in logo.skip_reason


def test_inline_images_are_documents_when_the_mailbox_says_so_or_nothing_references_them():
    (logo,) = parse_mail(_logo_mail(referenced=False), LIMITS).attachments
    assert logo.skip_reason is None
    limits = Limits(100_000, 1_000_000, 20, skip_inline_images=False)
    (logo,) = parse_mail(_logo_mail(referenced=True), limits).attachments
    assert logo.skip_reason is None


def test_a_small_image_is_decoration():
    small = MIMEImage(PNG[:100], "png")
    small.add_header("Content-Disposition", "attachment", filename="icon.png")
    (icon,) = parse_mail(_mail(small).as_bytes(), LIMITS).attachments
    assert "under 4096" in icon.skip_reason


@pytest.mark.parametrize(
    ("name", "media_type", "data", "expected"),
    [
        ("..\\..\\win.ini", "text/csv", b"a,b\n1,2\n", ("csv", "tabular", "media_type")),
        ("scan", "application/octet-stream", b"%PDF-1.7\n", ("pdf", "image", "content")),
        ("photo.bin", "", PNG, ("png", "image", "content")),
        ("report.csv", "image/png", b"a\tb\n1\t2\n", ("tsv", "tabular", "content")),
        ("report.csv", "image/png", b"a,b\n1,2\n", ("csv", "tabular", "content")),
        ("data", "application/octet-stream", b"x;y\n1;2\n", ("csv", "tabular", "content")),
        ("table", "", b"x\ty\n1\t2\n", ("tsv", "tabular", "content")),
        ("invoice.pdf", "application/pdf", PNG, ("png", "image", "content")),
        ("invoice.csv", "text/csv", b"MZ" + b"\x00" * 58 + b"\x40\x00\x00\x00PE\x00\x00", None),
        ("invoice.pdf", "application/pdf", b"\x7fELF" + b"\x00" * 60, None),
        ("run.txt", "text/plain", b"#!/bin/sh\nrm -rf /\n", None),
        ("page.html", "text/html", b"<html><p>a,b</p></html>", ("html", None, "extension")),
        ("notes", "application/octet-stream", b"Total: 5\n", ("unknown", None, "content")),
        ("MZ.csv", "text/csv", b"MZ,code\n1,2\n", ("csv", "tabular", "extension")),
    ],
)
def test_the_bytes_decide_when_the_name_is_unknown_or_disagrees(name, media_type, data, expected):
    typing = classify(name, media_type, data)
    if expected is None:
        assert (typing.file_type, typing.pipeline) == ("executable", None)
    else:
        assert (typing.file_type, typing.pipeline, typing.rule) == expected


@pytest.mark.parametrize(
    ("name", "media_type", "data", "reason"),
    [
        (
            "form.xlsx",
            XLSX,
            b"PK\x03\x04 not a workbook",
            "not a readable XLSX file: its content is a ZIP archive without a workbook in it",
        ),
        ("scan.png", "image/png", b"GIF89a" + b"\x00" * 40, "not a readable PNG file: its content"),
        ("sheet.xls", "application/vnd.ms-excel", b"a\tb\n1\t2\n", None),
    ],
)
def test_a_file_whose_bytes_are_not_the_type_it_was_sent_as_is_skipped_saying_why(
    name, media_type, data, reason
):
    part = MIMEApplication(data, Name=name)
    part.replace_header("Content-Type", f'{media_type}; name="{name}"')
    part.add_header("Content-Disposition", "attachment", filename=name)
    (parsed,) = parse_mail(_mail(part).as_bytes(), LIMITS).attachments
    if reason is None:  # tab-separated text sent as .xls: the bytes decide, it is a TSV
        assert (parsed.file_type, parsed.skip_reason) == ("tsv", None)
    else:
        assert parsed.pipeline is None and parsed.skip_reason.startswith(reason)
        assert "is not recognized" not in parsed.skip_reason


def test_a_csv_part_named_ini_becomes_a_csv_file_with_its_rule():
    (part,) = parse_mail(_mail(_csv_part("..\\..\\win.ini")).as_bytes(), LIMITS).attachments
    assert (part.name, part.file_type, part.pipeline, part.type_rule) == (
        "win.ini",
        "csv",
        "tabular",
        "media_type",
    )
    assert part.skip_reason is None


def test_executable_content_is_skipped_whatever_its_name():
    exe = _csv_part("invoice.csv", b"MZ" + b"\x00" * 58 + b"\x40\x00\x00\x00PE\x00\x00")
    (part,) = parse_mail(_mail(exe).as_bytes(), LIMITS).attachments
    assert part.skip_reason == "executable content is never a document"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b"=?gb18030?b?1tDOxLeixrE=?=", "中文发票"),
        (b"=?gb2312?b?1tDOxA==?=", "中文"),
        (b"=?big5?b?pKSk5bVvsrw=?=", "中文發票"),
        (b"=?shift_jis?b?kL+LgY+R?=", "請求書"),
        (b"=?koi8-r?b?8NLJ18XU?=", "Привет"),
        (b"Re: =?utf-8?q?caf=C3=A9?= =?iso-8859-1?q?_na=EFve?= done", "Re: café naïve done"),
        (b"=?utf-8?b?w6k=?==?koi8-r?b?8A==?=", "éП"),
        (b"=?x-unknown?q?a=FFb?=", "a\ufffdb"),
        (b"=?utf-8?q?bad_=FF=FE_=C3=28?=", "bad \ufffd\ufffd \ufffd("),
        (b"raw \xff\xfe \xc3(", "raw \ufffd\ufffd \ufffd("),
    ],
)
def test_header_charsets_decode_and_undecodable_bytes_become_replacement_characters(
    header, expected
):
    raw = b"From: a@example.com\r\nSubject: " + header + b"\r\n\r\nbody\r\n"
    subject = parse_mail(raw, LIMITS).subject
    assert subject == expected
    assert "\u00ff" not in subject and "\u00c3" not in subject, "no Latin-1 mojibake"
