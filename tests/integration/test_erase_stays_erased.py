"""An erased mail stays erased: intake skips it on every path that reads it again.

On pymap and Dovecot, Postgres and the object store: a cursor moved back below it, a
changed UIDVALIDITY, the same bytes in another folder, and a second delivery of it (other
headers, same Message-ID) all store nothing of it, open no job and leave no object behind.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from mailroom.adapters.storage import content_key
from mailroom.db.models import ErasedMail, InboundMail, ObjectDeletion
from mailroom.intake.batch import BatchContext
from mailroom.intake.operations import reset_mailbox
from mailroom.lifecycle.erase import erase_mail
from mailroom.lifecycle.objects import delete_queued_objects
from mailroom.settings import IntakeSettings
from tests.fixtures.imap import make_mail, new_folder, on_every_server

pytestmark = pytest.mark.integration

SECRET_CSV = b"name,iban\nJane Roe,DE02120300000000202051\n"


def _secret_mail() -> bytes:
    return make_mail(
        7,
        subject="my bank details",
        message_id="<erase-me@example.com>",
        attachments=[("iban.csv", "text/csv", SECRET_CSV)],
    )


async def _ingest_and_erase(env) -> tuple[bytes, int]:
    """The secret mail and a plain one ingested, then the secret one erased."""
    secret = _secret_mail()
    (secret_uid, _) = env.append(secret, make_mail(8))
    assert (await env.poll()).result.ingested == 2
    (mail,) = [m for m in await env.mails() if m.uid == secret_uid]
    report = await erase_mail(env.sessions, env.store, mail.id, operator="dpo")
    assert report.erased and report.jobs == 1
    return secret, secret_uid


async def _assert_nothing_of_it(env, secret: bytes) -> None:
    mails = await env.mails()
    assert [m.subject for m in mails] == ["mail 8"], "the erased mail was not stored again"
    assert await env.jobs() == [], "no recognition job for the erased mail"
    store = env.store
    attachment = content_key(SECRET_CSV, prefix="attachments", suffix=".csv")
    body = content_key(secret, prefix="mail", suffix=".eml")
    assert not await store.exists(store.bucket("incoming"), attachment)
    assert not await store.exists(store.bucket("mail"), body)


@on_every_server
async def test_a_cursor_moved_back_below_an_erased_mail_skips_it(intake_env):
    secret, _ = await _ingest_and_erase(intake_env)

    await reset_mailbox(intake_env.sessions, "box", uid=0, operator="ops")
    outcome = await intake_env.poll()

    assert outcome.status == "done"
    assert (outcome.result.ingested, outcome.result.duplicates) == (0, 1)
    assert outcome.result.erased == 1
    await _assert_nothing_of_it(intake_env, secret)
    async with intake_env.sessions() as session:
        (tomb,) = await session.scalars(select(ErasedMail))
    assert tomb.content_sha256 and tomb.message_id_sha256
    assert "erase-me" not in tomb.message_id_sha256, "the Message-ID itself is not kept"


@on_every_server
async def test_a_changed_uidvalidity_reads_the_folder_again_without_the_erased_mail(intake_env):
    secret, _ = await _ingest_and_erase(intake_env)

    intake_env.server.delete_folder(intake_env.folder)
    intake_env.server.create_folder(intake_env.folder)
    intake_env.append(secret, make_mail(8))
    outcome = await intake_env.poll()

    assert outcome.status == "done" and outcome.result.erased == 1
    assert outcome.result.ingested == 1, "the plain mail has new bytes (new Message-ID)"
    mails = await intake_env.mails()
    assert sorted(m.subject for m in mails) == ["mail 8", "mail 8"]
    assert "my bank details" not in [m.subject for m in mails]


@on_every_server
async def test_a_copy_in_another_folder_or_a_second_delivery_is_skipped(intake_env):
    secret, _ = await _ingest_and_erase(intake_env)
    other = new_folder(intake_env.server)
    copy = intake_env.server.mailbox_settings("copy", other)
    intake_env.settings.intake = IntakeSettings(
        mailboxes=[*intake_env.settings.intake.mailboxes, copy], lease_s=30.0
    )
    # The same bytes, and the same mail delivered again with a header more (other bytes).
    redelivered = b"Received: from relay.example.com by mx.example.com\r\n" + secret
    intake_env.server.append(other, secret, redelivered)

    outcome = await intake_env.poll("copy")

    assert outcome.status == "done"
    assert (outcome.result.ingested, outcome.result.erased) == (0, 2)
    await _assert_nothing_of_it(intake_env, secret)
    async with intake_env.sessions() as session:
        count = await session.scalar(select(func.count()).select_from(InboundMail))
    assert count == 1


async def test_a_mail_erased_while_its_group_was_prepared_leaves_no_object(intake_env, monkeypatch):
    secret, _ = await _ingest_and_erase(intake_env)

    # The erase commits after the group's check and before the mail's statement.
    async def too_early(self, mails):
        return [False] * len(mails)

    monkeypatch.setattr(BatchContext, "erased", too_early)
    await reset_mailbox(intake_env.sessions, "box", uid=0, operator="ops")
    outcome = await intake_env.poll()

    assert outcome.status == "done" and outcome.result.erased == 1
    async with intake_env.sessions() as session:
        queued = {row.key for row in await session.scalars(select(ObjectDeletion))}
    attachment = content_key(SECRET_CSV, prefix="attachments", suffix=".csv")
    assert attachment in queued
    await delete_queued_objects(intake_env.sessions, intake_env.store, grace_s=0)
    await _assert_nothing_of_it(intake_env, secret)
