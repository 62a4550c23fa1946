"""Attachments through pymap and Dovecot into Postgres and the object store: names, types, limits."""

from __future__ import annotations

import pytest

from tests.fixtures.imap import make_mail, on_every_server

pytestmark = [pytest.mark.integration, on_every_server]


async def _ingest_one(env, raw: bytes):
    env.append(raw)
    outcome = await env.poll()
    assert outcome.status == "done", outcome
    (mail,) = await env.mails()
    return mail, await env.files(), await env.jobs()


async def test_mail_without_attachments_is_stored_without_files_or_jobs(intake_env):
    mail, files, jobs = await _ingest_one(intake_env, make_mail(1))
    assert mail.status == "stored" and mail.raw_object_id is not None
    assert files == [] and jobs == []
    assert intake_env.nudges == [], "no job, no nudge"


async def test_thirty_attachments_become_thirty_files_with_a_job_each(intake_env):
    attachments = [(f"sheet-{i:02d}.csv", "text/csv", f"i\n{i}\n".encode()) for i in range(30)]
    _, files, jobs = await _ingest_one(intake_env, make_mail(1, attachments=attachments))
    assert [f.original_name for f in files] == [name for name, _, _ in attachments]
    assert len(jobs) == 30
    assert {j.id for j in jobs} == {f.current_recognition_job_id for f in files}
    for file in files:
        stored = await intake_env.store.get("mailroom-incoming", await _key(intake_env, file))
        assert stored.startswith(b"i\n")


async def _key(env, file):
    from sqlalchemy import select

    from mailroom.db.models import StoredObject

    async with env.sessions() as session:
        return await session.scalar(
            select(StoredObject.key).where(StoredObject.id == file.object_id)
        )


async def test_traversal_names_keep_only_their_last_part(intake_env):
    raw = (
        b"From: a@example.com\r\nSubject: names\r\nMessage-ID: <names@x>\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=B\r\n\r\n"
        b"--B\r\nContent-Type: text/csv\r\n"
        b'Content-Disposition: attachment; filename="../../etc/passwd"\r\n\r\na,b\r\n'
        b"--B\r\nContent-Type: text/csv\r\n"
        b'Content-Disposition: attachment; filename="..\\\\..\\\\win.csv"\r\n\r\nc,d\r\n'
        b"--B\r\nContent-Type: application/pdf\r\n"
        b'Content-Disposition: attachment; filename=".."\r\n\r\n%PDF\r\n'
        b"--B\r\nContent-Type: text/csv\r\n"
        b"Content-Disposition: attachment; filename*=UTF-8''tab%09here%01.csv\r\n\r\ne,f\r\n"
        b"--B--\r\n"
    )
    _, files, _ = await _ingest_one(intake_env, raw)
    names = [f.original_name for f in files]
    assert names == ["passwd", "win.csv", "attachment-3.pdf", "tab here .csv"]
    # No extension left on "passwd": the media type decides.
    assert [f.file_type for f in files] == ["csv", "csv", "pdf", "csv"]
    assert all(f.status == "UPLOADED" for f in files)


async def test_rfc2231_and_rfc2047_names_are_decoded(intake_env):
    raw = (
        b"From: a@example.com\r\nSubject: =?utf-8?q?Rechnung_f=C3=BCr_M=C3=A4rz?=\r\n"
        b"Message-ID: <2231@x>\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/mixed; boundary=B\r\n\r\n"
        b"--B\r\nContent-Type: application/pdf\r\nContent-Disposition: attachment;\r\n"
        b" filename*0*=UTF-8''%E2%82%AC%20Rechnung%20;\r\n filename*1*=M%C3%A4rz.pdf\r\n\r\n%PDF\r\n"
        b"--B\r\nContent-Type: image/png\r\nContent-Disposition: inline;\r\n"
        b' filename="=?utf-8?q?B=C3=BCro.png?="\r\n\r\nPNG\r\n'
        b"--B--\r\n"
    )
    mail, files, jobs = await _ingest_one(intake_env, raw)
    assert mail.subject == "Rechnung für März"
    assert [f.original_name for f in files] == ["€ Rechnung März.pdf", "Büro.png"]
    # The three-byte image is under intake.min_image_bytes: decoration, stored without a job.
    assert [j.file_id for j in jobs] == [files[0].id]
    assert "under 4096" in files[1].status_reason


async def test_oversize_and_surplus_attachments_are_recorded_as_skipped(intake_env):
    intake_env.settings.intake.max_attachment_bytes = 1000
    intake_env.settings.intake.max_attachments = 2
    attachments = [
        ("big.csv", "text/csv", b"x" * 5000),
        ("small.csv", "text/csv", b"a,b\n"),
        ("third.csv", "text/csv", b"c,d\n"),
    ]
    _, files, jobs = await _ingest_one(intake_env, make_mail(1, attachments=attachments))
    big, small, third = files
    assert (big.status, big.object_id, big.size) == ("SKIPPED", None, 5000)
    assert "exceeds the limit of 1000" in big.status_reason
    assert (small.status, small.status_reason) == ("UPLOADED", None)
    assert third.status == "SKIPPED" and "over the limit of 2" in third.status_reason
    assert [j.file_id for j in jobs] == [small.id]


async def test_mail_over_the_size_limit_is_recorded_without_content(intake_env):
    intake_env.settings.intake.max_mail_bytes = 500
    big = make_mail(1, attachments=[("a.csv", "text/csv", b"x" * 2000)])
    mail, files, _ = await _ingest_one(intake_env, big)
    assert mail.raw_object_id is None and files == []
    assert "exceeds the limit of 500" in mail.last_error
    assert (await intake_env.cursor()).last_uid == mail.uid, "the cursor moves on"


async def test_unknown_types_are_stored_but_skipped(intake_env):
    attachments = [("notes.docx", "application/octet-stream", b"PK..")]
    _, (file,), jobs = await _ingest_one(intake_env, make_mail(1, attachments=attachments))
    assert (file.status, file.file_type, jobs) == ("SKIPPED", "docx", [])
    assert file.object_id is not None and "not recognized" in file.status_reason


async def test_non_utf8_headers_do_not_crash_the_ingest(intake_env):
    raw = (
        b"From: =?iso-8859-1?q?J=F6rg?= <j\xf6rg@example.com>\r\n"
        b"Subject: caf\xe9 \xff\xfe bill\r\nMessage-ID: <latin\xe9@x>\r\n"
        b"Return-Path: <bounce@example.com>\r\n"
        b"Authentication-Results: mx.example.com; spf=pass\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=B\r\n\r\n"
        b"--B\r\nContent-Type: text/csv\r\n"
        b'Content-Disposition: attachment; filename="r\xe9sum\xe9.csv"\r\n\r\na,b\r\n'
        b"--B--\r\n"
    )
    mail, (file,), (job,) = await _ingest_one(intake_env, raw)
    assert mail.subject.startswith("caf") and mail.subject.endswith("bill")
    assert mail.message_id.startswith("<latin")
    assert mail.return_path == "bounce@example.com"
    assert mail.authentication_results == "mx.example.com; spf=pass"
    assert file.original_name.endswith(".csv") and job.pipeline == "tabular"


async def test_nul_and_raw_eight_bit_bytes_are_stored(intake_env):
    # Dovecot hands a NUL back as 0x80, pymap as it came: either way the mail is stored.
    raw = (
        b"From: a@example.com\r\nSubject: nul\x00here caf\xc3\xa9 \xff\r\n"
        b"Message-ID: <bytes@x>\r\n\r\nbefore\x00after \xe4\xf6\xfc\r\n"
    )
    mail, files, _ = await _ingest_one(intake_env, raw)
    assert (mail.status, mail.message_id, files) == ("stored", "<bytes@x>", [])
    # NUL (or Dovecot's 0x80 for it) is no character worth keeping: a space or U+FFFD.
    assert mail.subject.startswith("nul") and "here café" in mail.subject
