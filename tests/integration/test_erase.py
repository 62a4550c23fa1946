"""Erasure of one mail and its legal hold, on Postgres and S3 (moto), through the core and CLI."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select, update
from typer.testing import CliRunner

from mailroom.cli import app
from mailroom.db.audit import add_audit_event
from mailroom.db.engine import transaction
from mailroom.db.models import (
    AuditEvent,
    ChannelMessage,
    Document,
    InboundMail,
    MailboxCursor,
    ObjectDeletion,
    RecognitionJob,
    StoredFile,
    StoredObject,
)
from mailroom.errors import MailOnLegalHold
from mailroom.lifecycle.erase import ERASE_ACTION, erase_mail, set_legal_hold

pytestmark = pytest.mark.integration


async def _count(world, model, *where):
    async with world.sessions() as session:
        return await session.scalar(select(func.count()).select_from(model).where(*where))


async def _events(world, action):
    async with world.sessions() as session:
        return list(await session.scalars(select(AuditEvent).where(AuditEvent.action == action)))


async def test_erase_removes_the_mail_and_everything_from_it_keeps_shared_objects_and_audits(
    lifecycle_world,
):
    world = lifecycle_world
    shared = b"invoice_number,total\nSHARED-9,90\n"
    erased = await world.mail(age_days=1, attachment=shared)
    other = await world.mail(age_days=1, attachment=shared)

    report = await erase_mail(world.sessions, world.store, erased.mail_id, operator="auditor")

    assert report.erased and (report.files, report.jobs, report.documents) == (1, 1, 1)
    assert report.channel_messages == 1 and report.deletion.deleted == 2
    assert await world.stored(erased) == [False, True, False], "the shared attachment stays"
    assert await world.stored(other) == [True, True, True]
    for model, where in (
        (InboundMail, InboundMail.id == erased.mail_id),
        (StoredFile, StoredFile.id == erased.file_id),
        (RecognitionJob, RecognitionJob.id == erased.job_id),
        (Document, Document.id == erased.document_id),
        (ChannelMessage, ChannelMessage.id == erased.message_id),
    ):
        assert await _count(world, model, where) == 0, model.__name__
    assert await _count(world, StoredObject) == 3, "the other mail's three, one shared"
    assert await _count(world, ObjectDeletion) == 0
    (event,) = await _events(world, ERASE_ACTION)
    assert (event.actor_type, event.actor_id) == ("operator", "auditor")
    assert event.target == f"mail:{erased.mail_id}" and event.created_at is not None
    assert event.detail["file_ids"] == [erased.file_id]
    assert event.detail["document_ids"] == [erased.document_id]
    assert event.detail["channel_message_ids"] == [erased.message_id]
    assert event.detail["mailbox"] == "billing"
    assert "mail 1" not in str(event.detail), "no mail content in the audit row"

    again = await erase_mail(world.sessions, world.store, erased.mail_id, operator="auditor")
    assert not again.erased
    assert len(await _events(world, ERASE_ACTION)) == 1


async def test_a_mail_on_legal_hold_is_refused_until_released(lifecycle_world):
    world = lifecycle_world
    rows = await world.mail(age_days=1)
    assert await set_legal_hold(world.sessions, rows.mail_id, held=True, operator="legal")
    assert not await set_legal_hold(world.sessions, rows.mail_id, held=True, operator="legal")

    with pytest.raises(MailOnLegalHold, match="legal hold"):
        await erase_mail(world.sessions, world.store, rows.mail_id, operator="ops")
    assert await world.stored(rows) == [True, True, True]
    assert await _count(world, InboundMail) == 1

    assert await set_legal_hold(world.sessions, rows.mail_id, held=False, operator="legal")
    assert (await erase_mail(world.sessions, world.store, rows.mail_id, operator="ops")).erased
    actions = [e.action for e in await _events(world, "intake.hold")]
    actions += [e.action for e in await _events(world, "intake.release")]
    assert actions == ["intake.hold", "intake.release"]


@pytest.fixture
def cli_env(lifecycle_world, monkeypatch):
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


async def test_the_cli_holds_refuses_releases_erases_and_says_nothing_is_left(cli_env):
    world = cli_env
    rows = await world.mail(age_days=1)
    mail = str(rows.mail_id)

    async def run(*args):
        # In a thread: the command runs its own event loop, as from a shell.
        argv = ["intake", *args, "--mail", mail, "--operator", "dpo"]
        return await asyncio.to_thread(CliRunner().invoke, app, argv)

    held = await run("hold")
    assert held.exit_code == 0 and f"mail {mail} on legal hold" in held.output
    refused = await run("erase")
    assert refused.exit_code == 1 and "is on legal hold" in refused.output
    assert await world.stored(rows) == [True, True, True]
    assert (await run("release")).exit_code == 0
    erased = await run("erase")
    assert erased.exit_code == 0, erased.output
    assert (
        f"erased mail {mail}: 1 file(s)" in erased.output and "3 object(s) deleted" in erased.output
    )
    assert await world.stored(rows) == [False, False, False]
    again = await run("erase")
    assert again.exit_code == 0 and "nothing to erase" in again.output
    unknown = await run("hold")
    assert unknown.exit_code == 1 and f"no mail {mail}" in unknown.output


async def test_erase_scrubs_the_audit_rows_about_the_mail_and_leaves_the_others(lifecycle_world):
    world = lifecycle_world
    erased = await world.mail(age_days=1)
    other = await world.mail(age_days=1)
    blocked = {"uidvalidity": 1, "message_id": "<jane@example.com>", "error": "Jane's IBAN"}
    async with transaction(world.sessions) as session:
        for uid in (erased_uid := 1, other_uid := 2):
            add_audit_event(
                session,
                actor_type="system",
                actor_id="host-1",
                action="intake.cursor_blocked",
                target="mailbox:billing/INBOX",
                detail={"uid": uid, "retry_count": 5, **blocked},
            )
        for job in (erased.job_id, other.job_id):
            add_audit_event(
                session,
                actor_type="operator",
                actor_id="bob",
                action="recognition.replayed",
                target=f"recognition_job:{job}",
                detail={"attempt": 2, "reason": "Jane Roe's payslip was cut"},
            )

    async with transaction(world.sessions) as session:  # the mailbox is blocked at the mail
        await session.execute(
            update(MailboxCursor).values(
                status="blocked", blocked_uid=1, blocked_message_id="<jane@x>", last_error="Jane"
            )
        )

    report = await erase_mail(world.sessions, world.store, erased.mail_id, operator="dpo")

    assert report.audit_rows_scrubbed == 2
    async with world.sessions() as session:
        cursor = await session.scalar(select(MailboxCursor))
    assert (cursor.status, cursor.blocked_uid, cursor.blocked_message_id) == ("blocked", 1, None)
    assert cursor.last_error == "content removed by erasure"
    rows = {(e.action, e.target, e.detail.get("uid")): e for e in await _all_events(world)}
    scrubbed = rows[("intake.cursor_blocked", "mailbox:billing/INBOX", erased_uid)].detail
    assert scrubbed == {
        "uid": 1,
        "uidvalidity": 1,
        "retry_count": 5,
        "scrubbed": "content removed by erasure",
    }
    assert rows[("intake.cursor_blocked", "mailbox:billing/INBOX", other_uid)].detail["error"]
    replayed = rows[("recognition.replayed", f"recognition_job:{erased.job_id}", None)]
    assert replayed.detail == {"attempt": 2, "scrubbed": "content removed by erasure"}
    assert replayed.actor_id == "bob"
    untouched = rows[("recognition.replayed", f"recognition_job:{other.job_id}", None)]
    assert "Jane" in untouched.detail["reason"]


async def _all_events(world):
    async with world.sessions() as session:
        return list(await session.scalars(select(AuditEvent)))
