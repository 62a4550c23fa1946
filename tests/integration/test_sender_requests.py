"""A data subject's requests by address: export and erase every mail from a sender.

On Postgres and S3 (moto), through the CLI as an operator runs it: counts said, audit
events that name the address only by its SHA-256, mails on legal hold kept, safe to repeat.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import zipfile

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from mailroom.cli import app
from mailroom.db.models import AuditEvent, InboundMail

pytestmark = pytest.mark.integration

JANE = "jane.roe@example.com"
TARGET = "sender:sha256:" + hashlib.sha256(JANE.encode()).hexdigest()


@pytest.fixture
def world(lifecycle_world, monkeypatch):
    storage = lifecycle_world.settings.storage
    for name, value in {
        "DATABASE__URL": lifecycle_world.settings.database.url,
        "STORAGE__KIND": "s3",
        "STORAGE__S3_ENDPOINT_URL": storage.s3_endpoint_url,
        "STORAGE__S3_ACCESS_KEY": "test",
        "STORAGE__S3_SECRET_KEY": "test",
        "STORAGE__MAIL_BUCKET": storage.mail_bucket,
        "STORAGE__INCOMING_BUCKET": storage.incoming_bucket,
        "STORAGE__RESULTS_BUCKET": storage.results_bucket,
    }.items():
        monkeypatch.setenv(f"MAILROOM_{name}", value)
    return lifecycle_world


async def _run(*args: str):
    # In a thread: the command runs its own event loop, as from a shell.
    argv = ["intake", *args, "--operator", "dpo"]
    return await asyncio.to_thread(CliRunner().invoke, app, argv)


async def _events(world, action):
    async with world.sessions() as session:
        query = select(AuditEvent).where(AuditEvent.action == action).order_by(AuditEvent.id)
        return list(await session.scalars(query))


async def test_export_zips_every_mail_file_document_and_notification_from_a_sender(world, tmp_path):
    first = await world.mail(age_days=1, sender=JANE, attachment=b"name,iban\nJane,DE02\n")
    second = await world.mail(age_days=1, sender="Jane.Roe@EXAMPLE.com")
    await world.mail(age_days=1, sender="someone@example.com")
    out = tmp_path / "jane.zip"

    for _ in range(2):  # a second run replaces the zip whole
        result = await _run("export", "--sender", JANE, "--out", str(out))
        assert result.exit_code == 0, result.output
        assert (
            f"exported 2 mail(s) from {JANE} to {out}: 2 file(s), 2 document(s), "
            "2 notification(s)" in result.output
        )

    with zipfile.ZipFile(out) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        assert manifest["format"] == "mailroom-export/1" and manifest["sender"] == JANE
        assert [m["id"] for m in manifest["mails"]] == [first.mail_id, second.mail_id]
        mail = manifest["mails"][0]
        assert mail["subject"] and mail["mailbox"] == "billing"
        assert archive.read(mail["eml"]).startswith(b"Subject: mail ")
        (file,) = mail["files"]
        assert file["name"] == "invoice.csv" and file["status"] == "RECOGNIZED"
        assert archive.read(file["content"]) == b"name,iban\nJane,DE02\n"
        (document,) = mail["documents"]
        assert json.loads(archive.read(document))["document_type"] == "invoice"
        (notification,) = mail["notifications"]
        assert json.loads(archive.read(notification))["body"].endswith("recognized")
        names = archive.namelist()
    assert len(names) == 1 + 2 * 4, names
    assert not list(tmp_path.glob("*.part"))
    events = await _events(world, "intake.export")
    assert len(events) == 2 and {e.target for e in events} == {TARGET}
    assert events[0].actor_id == "dpo"
    assert events[0].detail["mail_ids"] == [first.mail_id, second.mail_id]
    assert "jane" not in json.dumps(events[0].detail).lower(), "the address is not kept"


async def test_erase_by_sender_erases_each_mail_keeps_held_ones_and_is_safe_to_repeat(world):
    erased = [await world.mail(age_days=1, sender=JANE) for _ in range(2)]
    held = await world.mail(age_days=1, sender=JANE, held=True)
    other = await world.mail(age_days=1, sender="someone@example.com")

    result = await _run("erase", "--sender", JANE.upper())

    assert result.exit_code == 0, result.output
    assert (
        f"erased 2 mail(s) from {JANE.upper()}: 2 file(s), 2 job(s), 2 document(s), "
        "2 notification(s), 6 object(s) deleted" in result.output
    )
    assert f"kept 1 mail(s) on legal hold: {held.mail_id}" in result.output
    for rows in erased:
        assert await world.stored(rows) == [False, False, False]
    assert await world.stored(held) == [True, True, True]
    assert await world.stored(other) == [True, True, True]
    async with world.sessions() as session:
        left = list(await session.scalars(select(InboundMail.id).order_by(InboundMail.id)))
    assert left == [held.mail_id, other.mail_id]

    again = await _run("erase", "--sender", JANE)
    assert again.exit_code == 0 and f"erased 0 mail(s) from {JANE}" in again.output
    first, second = await _events(world, "intake.erase_sender")
    assert first.target == second.target == TARGET
    assert first.detail["mail_ids"] == [r.mail_id for r in erased]
    assert first.detail["held_mail_ids"] == [held.mail_id] and second.detail["mail_ids"] == []
    assert len(await _events(world, "intake.erase")) == 2, "one per mail"


async def test_erase_wants_exactly_one_of_mail_and_sender(world):
    neither = await _run("erase")
    both = await _run("erase", "--mail", "1", "--sender", JANE)
    for result in (neither, both):
        assert result.exit_code == 1
        assert "give either --mail ID or --sender ADDRESS" in result.output
