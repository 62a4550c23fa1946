"""Intake failures against pymap (and Dovecot, for what servers differ on) and Postgres: backoff,
blocking, login, outages, logout, UIDVALIDITY."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import SecretStr
from sqlalchemy import text

from mailroom.adapters.imap import ImapMailbox
from mailroom.adapters.imap.memory import MemoryServer
from mailroom.adapters.storage import put_concurrently
from mailroom.devtools.stack import free_port
from mailroom.errors import StorageUnavailable
from mailroom.intake.audit import CURSOR_BLOCKED, UIDVALIDITY_CHANGED, UNBLOCKED
from mailroom.intake.operations import unblock_mailbox
from tests.fixtures.imap import csv_mail, make_mail, on_every_server

pytestmark = pytest.mark.integration


class PoisonStore:
    """The test's object store, failing every put of bytes that contain ``b"POISON"``."""

    def __init__(self, store):
        self.store = store
        self.poisoned = True

    def bucket(self, role):
        return self.store.bucket(role)

    async def put(self, role, key, data, *, media_type):
        if self.poisoned and b"POISON" in data:
            raise StorageUnavailable("disk full")
        return await self.store.put(role, key, data, media_type=media_type)

    async def put_many(self, requests):
        return await put_concurrently(self, requests)

    async def get(self, bucket, key):
        return await self.store.get(bucket, key)

    async def exists(self, bucket, key):
        return await self.store.exists(bucket, key)


def _poison_mail() -> bytes:
    return make_mail(99, subject="POISON", message_id="<poison@example.com>")


async def test_failing_mail_backs_off_then_blocks_with_one_audit_event(intake_env):
    good, poison, after = intake_env.append(csv_mail(1), _poison_mail(), csv_mail(2))
    intake_env.store = PoisonStore(intake_env.store)
    waits = []

    for attempt in range(1, 6):
        outcome = await intake_env.poll()
        cursor = await intake_env.cursor()
        assert cursor.retry_count == attempt
        assert cursor.last_uid == good, "the batch stops at the failed UID"
        assert cursor.lease_id is None
        if attempt < 5:
            assert outcome.status == "mail_failed"
            assert cursor.status == "failed"
            # Both times come from the same database clock reading (updated_at is that now).
            waits.append(round((cursor.next_retry_at - cursor.updated_at).total_seconds()))
            assert (await intake_env.poll()).reason == "backoff"
            intake_env.clock.advance(301)

    assert waits == [2, 4, 8, 16]
    assert outcome.status == "blocked"
    assert (cursor.status, cursor.blocked_uid, cursor.blocked_message_id) == (
        "blocked",
        poison,
        "<poison@example.com>",
    )
    assert "disk full" in cursor.last_error
    assert cursor.next_retry_at is None
    intake_env.clock.advance(3600)
    assert (await intake_env.poll()).reason == "blocked"

    (event,) = await intake_env.audit(CURSOR_BLOCKED)
    assert event.detail["uid"] == poison
    assert event.detail["message_id"] == "<poison@example.com>"
    assert event.detail["retry_count"] == 5
    assert "disk full" in event.detail["error"]
    failed = [m for m in await intake_env.mails() if m.uid == poison]
    assert [(m.status, m.retry_count, m.message_id) for m in failed] == [
        ("failed", 5, "<poison@example.com>")
    ]
    assert failed[0].last_attempt_at is not None and "disk full" in failed[0].last_error

    # The operator fixes the cause and unblocks: the mail and the ones behind it arrive in order.
    intake_env.store.poisoned = False
    await unblock_mailbox(intake_env.sessions, "box")
    assert len(await intake_env.audit(UNBLOCKED)) == 1
    assert (await intake_env.poll()).status == "done"
    mails = await intake_env.mails()
    assert [(m.uid, m.status) for m in mails] == [
        (good, "stored"),
        (poison, "stored"),
        (after, "stored"),
    ]
    assert mails[1].retry_count == 5, "the attempts stay on record"
    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.retry_count, cursor.blocked_uid) == ("idle", 0, None)


async def test_a_blocked_mailbox_never_stalls_another(intake_env, imap_server):
    other_folder = intake_env.folder + "-other"
    imap_server.create_folder(other_folder)
    intake_env.settings.intake.mailboxes.append(imap_server.mailbox_settings("other", other_folder))
    intake_env.settings.intake.max_retries = 1
    intake_env.append(_poison_mail())
    (other_uid,) = imap_server.append(other_folder, csv_mail(5))
    intake_env.store = PoisonStore(intake_env.store)

    assert (await intake_env.poll("box")).status == "blocked"
    assert (await intake_env.poll("other")).status == "done"

    stored = [m for m in await intake_env.mails() if m.status == "stored"]
    assert [m.uid for m in stored] == [other_uid]


@on_every_server
async def test_refused_login_is_recorded_and_backed_off(intake_env):
    box = intake_env.settings.intake.mailboxes[0]
    box.password = SecretStr("wrong")

    outcome = await intake_env.poll()

    assert outcome.status == "batch_failed"
    cursor = await intake_env.cursor()
    assert cursor.status == "failed" and cursor.retry_count == 1
    assert cursor.last_error.startswith("MailboxLoginRejected")
    assert cursor.next_retry_at - cursor.updated_at <= timedelta(seconds=2)
    assert (await intake_env.poll()).reason == "backoff"
    intake_env.clock.advance(3)
    await intake_env.poll()
    assert (await intake_env.cursor()).retry_count == 2, "refusals back off"
    assert (await intake_env.cursor()).status == "failed", "until block_after_refusals (5)"


async def test_unreachable_server_is_a_retryable_batch_failure(intake_env):
    box = intake_env.settings.intake.mailboxes[0]
    box.port = free_port()  # nothing listens there

    outcome = await intake_env.poll()

    assert outcome.status == "batch_failed"
    cursor = await intake_env.cursor()
    assert cursor.last_error.startswith("MailboxUnavailable")
    assert cursor.lease_id is None and cursor.next_retry_at is not None


class ResetOnLogout(ImapMailbox):
    """The real adapter, but the server resets the connection when we log out."""

    closed_sockets: list[object] = []

    def _connect(self):
        client = super()._connect()

        def reset():
            ResetOnLogout.closed_sockets.append(client._imap.sock)
            raise ConnectionResetError("connection reset by peer")

        client.logout = reset
        return client


async def test_connection_reset_during_logout_does_not_replace_the_real_error(intake_env):
    intake_env.settings.intake.mailboxes[0].folder = "no-such-folder"

    outcome = await intake_env.poll(connect=ResetOnLogout)

    assert outcome.status == "batch_failed"
    cursor = await intake_env.cursor()
    assert cursor.last_error.startswith("MailboxFolderMissing: SELECT"), cursor.last_error
    (sock,) = ResetOnLogout.closed_sockets
    assert sock.fileno() == -1, "the socket is closed even though LOGOUT failed"


@on_every_server
async def test_uidvalidity_change_restarts_from_zero_without_duplicates(intake_env):
    first = [csv_mail(1), csv_mail(2)]
    intake_env.append(*first)
    await intake_env.poll()
    before = await intake_env.cursor()

    intake_env.server.delete_folder(intake_env.folder)
    intake_env.server.create_folder(intake_env.folder)
    new_uids = intake_env.append(*first, csv_mail(3))
    outcome = await intake_env.poll()

    assert outcome.status == "done"
    assert (outcome.result.ingested, outcome.result.duplicates) == (1, 2)
    cursor = await intake_env.cursor()
    assert cursor.uidvalidity != before.uidvalidity
    assert cursor.last_uid == new_uids[-1]
    mails = await intake_env.mails()
    assert len(mails) == 3
    assert sorted(m.subject for m in mails) == ["mail 1", "mail 2", "mail 3"]
    assert len(await intake_env.jobs()) == 3
    (event,) = await intake_env.audit(UIDVALIDITY_CHANGED)
    assert event.detail == {
        "old_uidvalidity": before.uidvalidity,
        "new_uidvalidity": cursor.uidvalidity,
        "old_last_uid": before.last_uid,
    }


async def test_a_failed_attempt_row_is_completed_when_the_mail_later_succeeds(intake_env):
    (uid,) = intake_env.append(_poison_mail())
    intake_env.store = PoisonStore(intake_env.store)
    await intake_env.poll()
    intake_env.store.poisoned = False
    intake_env.clock.advance(5)

    outcome = await intake_env.poll()

    assert outcome.status == "done"
    (mail,) = await intake_env.mails()
    assert (mail.uid, mail.status, mail.retry_count, mail.last_error) == (uid, "stored", 1, None)
    assert mail.next_retry_at is None and mail.raw_object_id is not None


async def test_fetch_error_fails_the_batch_and_closes_the_connection(intake_env):
    server = MemoryServer()
    server.create_folder(intake_env.folder)
    server.append(intake_env.folder, csv_mail(1))
    server.fail_fetch = True
    opened = []

    def connect(settings):
        box = server.factory()(settings)
        opened.append(box)
        return box

    outcome = await intake_env.poll(connect=connect)

    assert outcome.status == "batch_failed"
    assert "FETCH" in outcome.reason
    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.retry_count, cursor.last_uid) == ("failed", 1, 0)
    assert [box.connected for box in opened] == [False]
    assert await intake_env.mails() == []


async def test_a_group_of_mails_commits_in_one_transaction(intake_env):
    uids = intake_env.append(*(csv_mail(n) for n in range(3)))

    assert (await intake_env.poll()).status == "done"

    async with intake_env.sessions() as session:
        rows = (
            await session.execute(text("SELECT uid, xmin::text FROM inbound_mail ORDER BY uid"))
        ).all()
    assert [uid for uid, _ in rows] == uids
    assert len({xid for _, xid in rows}) == 1, "one transaction id for the group's mails"


async def test_a_mail_postgres_refuses_mid_group_keeps_the_mails_before_it(intake_env):
    """A group that fails is stored again a transaction per mail: those before the refused one stay."""
    await intake_env.add_mail_trigger(
        "refuse_mail",
        "IF NEW.subject = 'REFUSED' AND NEW.status = 'stored' THEN "
        "RAISE EXCEPTION 'mail refused by a check'; END IF;",
        events="INSERT OR UPDATE",
    )
    refused = make_mail(7, subject="REFUSED", message_id="<refused@example.com>")
    first, second, bad, after = intake_env.append(csv_mail(1), csv_mail(2), refused, csv_mail(3))

    outcome = await intake_env.poll()

    assert outcome.status == "mail_failed"
    assert "mail refused by a check" in outcome.reason
    cursor = await intake_env.cursor()
    assert (cursor.last_uid, cursor.status, cursor.retry_count) == (second, "failed", 1)
    mails = await intake_env.mails()
    assert [(m.uid, m.status) for m in mails] == [
        (first, "stored"),
        (second, "stored"),
        (bad, "failed"),
    ]
    assert len(await intake_env.jobs()) == 2, "nothing of the refused mail or the one after it"
    assert intake_env.nudges == [1]

    await intake_env.drop_mail_trigger("refuse_mail")
    intake_env.clock.advance(3)
    assert (await intake_env.poll()).status == "done"
    mails = await intake_env.mails()
    assert [(m.uid, m.status) for m in mails] == [
        (first, "stored"),
        (second, "stored"),
        (bad, "stored"),
        (after, "stored"),
    ]
    assert len(await intake_env.jobs()) == 3
