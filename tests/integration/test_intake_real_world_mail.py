"""Real-world mail through pymap and Dovecot: forwarded and winmail.dat documents, logos, types."""

from __future__ import annotations

import base64
import io
import zipfile
from email.mime.application import MIMEApplication
from email.mime.base import MIMEBase
from email.mime.image import MIMEImage
from email.mime.message import MIMEMessage
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

import pytest

from mailroom.db.models import StoredObject
from mailroom.devtools.tnef import make_winmail
from mailroom.ops.attention import needs_operator
from tests.fixtures.imap import on_every_server

pytestmark = [pytest.mark.integration, on_every_server]

CSV = b"invoice,total\nA-1,10\n"


async def _ingest_one(env, raw: bytes):
    env.append(raw)
    outcome = await env.poll()
    assert outcome.status == "done", outcome
    (mail,) = await env.mails()
    return mail, await env.files(), await env.jobs()


def _mail(*parts, subject: str = "real world") -> bytes:
    mail = MIMEMultipart()
    mail["Subject"], mail["From"], mail["Message-ID"] = subject, "a@example.com", "<rw@x>"
    mail.attach(MIMEText("see attached"))
    for part in parts:
        mail.attach(part)
    return mail.as_bytes()


def _attachment(data: bytes, media_type: str, name: str) -> MIMEApplication:
    part = MIMEApplication(data)
    part.replace_header("Content-Type", media_type)
    part.add_header("Content-Disposition", "attachment", filename=name)
    return part


async def test_a_forwarded_csv_becomes_a_file_with_a_job_under_its_container(intake_env):
    inner = MIMEMultipart()
    inner["Subject"] = "invoice"
    inner.attach(_attachment(CSV, "text/csv", "invoice.csv"))
    forwarded = MIMEMessage(inner)
    forwarded.add_header("Content-Disposition", "attachment", filename="forwarded.eml")
    _, (container, invoice), (job,) = await _ingest_one(intake_env, _mail(forwarded))
    assert (container.status, container.file_type, container.object_id is not None) == (
        "CONTAINER",
        "eml",
        True,
    )
    assert container.status_reason == "forwarded mail: 1 file extracted"
    assert (invoice.status, invoice.file_type, invoice.parent_file_id) == (
        "UPLOADED",
        "csv",
        container.id,
    )
    assert invoice.source_path == "forwarded.eml/invoice.csv"
    assert (job.file_id, job.pipeline) == (invoice.id, "tabular")


async def test_a_csv_inside_winmail_dat_becomes_a_file_with_a_job(intake_env):
    winmail = _attachment(
        make_winmail([("invoice.csv", CSV)]), "application/ms-tnef", "winmail.dat"
    )
    _, (container, invoice), (job,) = await _ingest_one(intake_env, _mail(winmail))
    assert (container.status, container.file_type) == ("CONTAINER", "tnef")
    assert (invoice.status, invoice.parent_file_id, invoice.source_path) == (
        "UPLOADED",
        container.id,
        "winmail.dat/invoice.csv",
    )
    assert job.file_id == invoice.id


async def test_a_signature_logo_is_stored_without_a_job(intake_env):
    related = MIMEMultipart("related")
    related.attach(MIMEText('<p>Ann</p><img src="cid:logo@example.com">', "html"))
    logo = MIMEImage(b"\x89PNG\r\n\x1a\n" + b"\x00" * 8000, "png")
    logo.add_header("Content-ID", "<logo@example.com>")
    logo.add_header("Content-Disposition", "inline", filename="logo.png")
    related.attach(logo)
    _, (file,), jobs = await _ingest_one(intake_env, _mail(related))
    assert (file.status, file.object_id is not None, jobs) == ("SKIPPED", True, [])
    assert "referenced by Content-ID" in file.status_reason


async def test_a_csv_part_named_ini_is_typed_csv_by_its_media_type_and_bytes(intake_env):
    part = _attachment(CSV, "text/csv", "..\\..\\win.ini")
    _, (file,), (job,) = await _ingest_one(intake_env, _mail(part))
    assert (file.original_name, file.file_type, file.type_rule, file.status) == (
        "win.ini",
        "csv",
        "media_type",
        "UPLOADED",
    )
    assert job.pipeline == "tabular"
    async with intake_env.sessions() as session:
        stored = await session.get(StoredObject, file.object_id)
    assert stored.key.endswith(".csv"), "the decided type's extension, not the sender's"


async def test_header_charsets_decode(intake_env):
    raw = (
        b"From: =?koi8-r?b?8NLJ18XU?= <a@example.com>\r\n"
        b"Subject: =?gb18030?b?1tDOxLeixrE=?= =?big5?b?pKSk5bVvsrw=?= "
        # The last word's bytes are not UTF-8: read with the mail's other charsets (KOI8-R).
        b"=?shift_jis?b?kL+LgY+R?= =?utf-8?b?896j1A==?= end\r\n"
        b"Message-ID: <charsets@x>\r\n\r\nbody\r\n"
    )
    mail, _, _ = await _ingest_one(intake_env, raw)
    assert mail.subject == "中文发票中文發票請求書Счёт end"


async def test_an_inline_unnamed_forwarded_invoice_is_opened(intake_env):
    inner = MIMEMultipart()
    inner["Subject"] = "invoice"
    inner.attach(_attachment(CSV, "text/csv", "invoice.csv"))
    forwarded = MIMEMessage(inner)
    forwarded.add_header("Content-Disposition", "inline")
    _, (container, invoice), (job,) = await _ingest_one(intake_env, _mail(forwarded))
    assert (container.status, container.original_name) == ("CONTAINER", "attachment-1.eml")
    assert (invoice.status, invoice.source_path) == ("UPLOADED", "attachment-1.eml/invoice.csv")
    assert job.file_id == invoice.id


async def test_a_base64_forwarded_invoice_is_opened(intake_env):
    inner = MIMEMultipart()
    inner["Subject"] = "invoice"
    inner.attach(_attachment(CSV, "text/csv", "invoice.csv"))
    forwarded = MIMEBase("message", "rfc822")
    forwarded["Content-Transfer-Encoding"] = "base64"
    forwarded.set_payload(base64.encodebytes(inner.as_bytes()).decode())
    _, (container, invoice), (job,) = await _ingest_one(intake_env, _mail(forwarded))
    assert (container.status, container.status_reason) == (
        "CONTAINER",
        "forwarded mail: 1 file extracted",
    )
    assert (invoice.original_name, job.file_id) == ("invoice.csv", invoice.id)


async def test_a_container_that_cannot_be_opened_waits_for_an_operator(intake_env):
    broken = _attachment(b"not a TNEF stream", "application/ms-tnef", "winmail.dat")
    mail, (container,), jobs = await _ingest_one(intake_env, _mail(broken))
    assert jobs == []
    assert container.status == "NEEDS_CHECK"
    assert container.status_reason.startswith("winmail.dat (TNEF) could not be opened: ")
    async with intake_env.sessions() as session:
        assert (await needs_operator(session))["files_needs_check"] == 1
    assert mail.status == "stored"


async def test_raw_8bit_headers_are_read_in_the_charset_the_mail_declares(intake_env):
    raw = (
        b'From: "' + "张伟".encode("gbk") + b'" <zhang@example.com>\r\n'
        b"Subject: " + "发票通知 十一月".encode("gbk") + b"\r\n"
        b"Message-ID: <gbk@x>\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: text/plain; charset=gb2312\r\n\r\n"
        + "附件是十一月的发票。".encode("gbk")
        + b"\r\n"
    )
    mail, _, _ = await _ingest_one(intake_env, raw)
    assert (mail.subject, mail.sender_name, mail.sender) == (
        "发票通知 十一月",
        "张伟",
        "zhang@example.com",
    )


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


async def test_a_zipped_invoice_becomes_a_file_with_a_job_and_a_bomb_waits_for_an_operator(
    intake_env,
):
    intake_env.settings.intake.max_attachment_bytes = 50_000_000
    invoices = _attachment(_zip({"11/invoice.csv": CSV}), "application/zip", "invoices.zip")
    bomb = _attachment(_zip({"zeros.csv": b"0" * 20_000_000}), "application/zip", "bomb.zip")
    _, (archive, invoice, refused), (job,) = await _ingest_one(intake_env, _mail(invoices, bomb))
    assert (archive.status, archive.status_reason) == (
        "CONTAINER",
        "archive (zip): 1 file extracted",
    )
    assert (invoice.status, invoice.source_path, invoice.parent_file_id) == (
        "UPLOADED",
        "invoices.zip/11/invoice.csv",
        archive.id,
    )
    assert job.file_id == invoice.id
    assert refused.status == "NEEDS_CHECK"
    assert "over the compression ratio limit of 100" in refused.status_reason
