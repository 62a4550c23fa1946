"""Mail over ``max_mail_bytes`` on pymap and Dovecot: the server names it and tells its size,
its headers alone are read, and it is recorded as oversize without its body ever being fetched.
A big attachment over ``max_attachment_bytes`` is recorded with its size, its mail stored without
its body."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import text

from mailroom.adapters.imap import FetchedMail, ImapMailbox
from mailroom.adapters.imap.memory import MemoryServer
from mailroom.db.clock import db_now
from mailroom.db.models import StoredObject
from mailroom.notifications.passes import _summaries
from mailroom.recognition.finality import finalize_settled_mails
from mailroom.settings import MailboxSettings
from tests.fixtures.imap import SERVERS, make_mail, new_folder, on_every_server, server_named

pytestmark = pytest.mark.integration

LIMIT = 4000


class _Recorder:
    """A factory of ``ImapMailbox`` connections that notes which UIDs were fetched whole."""

    def __init__(self) -> None:
        self.bodies: list[int] = []
        self.headers: list[int] = []

    def __call__(self, settings: MailboxSettings) -> ImapMailbox:
        recorder = self

        class Recording(ImapMailbox):
            async def fetch(self, uids: list[int]) -> list[FetchedMail]:
                recorder.bodies.extend(uids)
                return await super().fetch(uids)

            async def fetch_headers(self, uids: list[int]) -> list[FetchedMail]:
                recorder.headers.extend(uids)
                return await super().fetch_headers(uids)

        return Recording(settings)


def _big_mail(n: int) -> bytes:
    return make_mail(
        n, subject=f"big report {n}", attachments=[("big.csv", "text/csv", b"a,b\n" * 2000)]
    )


def _eml_objects(env) -> int:
    return len(list(env.settings.state_dir.rglob("*.eml")))


@on_every_server
async def test_an_oversize_mail_is_recorded_from_its_headers_without_its_body_fetched(
    intake_env,
):
    intake_env.settings.intake.max_mail_bytes = LIMIT
    big = _big_mail(2)
    small, oversize, last = intake_env.append(make_mail(1), big, make_mail(3))
    connect = _Recorder()
    outcome = await intake_env.poll(connect=connect)
    assert outcome.status == "done", outcome

    assert oversize not in connect.bodies and connect.headers == [oversize]
    assert sorted(connect.bodies) == [small, last]
    mails = {mail.uid: mail for mail in await intake_env.mails()}
    assert set(mails) == {small, oversize, last}
    mail = mails[oversize]
    assert (mail.status, mail.raw_object_id) == ("stored", None)
    assert mail.subject == "big report 2" and mail.sender == "sender2@example.com"
    assert mail.message_id and mail.message_id.startswith("<mail-2-")
    assert mail.internal_date is not None
    # The server's RFC822.SIZE (of the mail as it keeps it, with CRLF line ends).
    size = len(big.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    assert f"mail of {size} bytes exceeds the limit of {LIMIT}: oversize" in mail.last_error
    assert [f.mail_id for f in await intake_env.files()].count(mail.id) == 0
    assert _eml_objects(intake_env) == 2, "only the two small mails are in the object store"
    assert (await intake_env.cursor()).last_uid == last


@on_every_server
async def test_a_batch_of_one_oversize_mail_moves_the_cursor_past_it(intake_env):
    intake_env.settings.intake.max_mail_bytes = LIMIT
    (uid,) = intake_env.append(_big_mail(1))
    connect = _Recorder()
    assert (await intake_env.poll(connect=connect)).status == "done"
    assert (connect.bodies, connect.headers) == ([], [uid])
    (mail,) = await intake_env.mails()
    assert mail.raw_object_id is None and "oversize" in mail.last_error
    assert (await intake_env.cursor()).last_uid == uid


async def test_an_oversize_mail_is_final_at_once_and_its_notice_says_why(intake_env):
    intake_env.settings.intake.max_mail_bytes = LIMIT
    intake_env.append(_big_mail(1))
    assert (await intake_env.poll()).status == "done"
    async with intake_env.sessions() as session, session.begin():
        (mail,) = await intake_env.mails()
        assert await finalize_settled_mails(session, now=await db_now(session)) == [mail.id]
        (summary,) = await _summaries(session, [mail])
    text = summary.render()
    assert "big report 1" in text and "It was not read: mail of" in text and "oversize" in text


@on_every_server
async def test_a_big_attachment_over_its_limit_is_recorded_with_its_size_and_its_mail_stored_without_it(
    intake_env,
):
    intake_env.settings.intake.max_attachment_bytes = 1_000_000
    scan = b"%PDF-1.7\n" + random.Random(1).randbytes(1_500_000)
    attachments = [("scan.pdf", "application/pdf", scan), ("rates.csv", "text/csv", b"a,b\n1,2\n")]
    intake_env.append(make_mail(1, attachments=attachments))
    assert (await intake_env.poll()).status == "done"
    (mail,) = await intake_env.mails()
    big, rates = await intake_env.files()
    assert (big.status, big.object_id, big.size, big.file_type) == (
        "SKIPPED",
        None,
        len(scan),
        "pdf",
    )
    assert "exceeds the limit of 1000000" in big.status_reason
    assert (rates.status, [j.file_id for j in await intake_env.jobs()]) == ("UPLOADED", [rates.id])
    assert mail.raw_object_id is not None and mail.last_error is None
    assert _eml_objects(intake_env) == 1
    # The stored mail leaves the refused scan's body out and says what was removed.
    async with intake_env.sessions() as session:
        stored = await session.get(StoredObject, mail.raw_object_id)
    eml = await intake_env.store.get(stored.bucket, stored.key)
    assert stored.size == len(eml) < 100_000
    assert b"X-Mailroom-Removed: body of " in eml and b"sha256=" in eml
    assert mail.content_sha256 != stored.sha256, "the mail is known by the bytes received"


async def test_mail_by_mail_after_a_death_an_oversize_mail_is_not_fetched_either(
    intake_env, caplog
):
    intake_env.settings.intake.max_mail_bytes = LIMIT
    (first,) = intake_env.append(make_mail(1))
    assert (await intake_env.poll()).status == "done"
    oversize, last = intake_env.append(_big_mail(2), make_mail(3))
    async with intake_env.sessions() as session, session.begin():
        # What a worker that died in the last poll leaves: an attempt without an outcome.
        await session.execute(
            text("UPDATE mailbox_cursor SET attempt_uid = :uid, attempt_count = 1"),
            {"uid": first},
        )
    connect = _Recorder()
    assert (await intake_env.poll(connect=connect)).status == "done"
    assert "reading mail by mail" in caplog.text
    assert (connect.bodies, connect.headers) == ([last], [oversize])
    mails = {mail.uid: mail for mail in await intake_env.mails()}
    assert mails[oversize].raw_object_id is None and "oversize" in mails[oversize].last_error
    assert (await intake_env.cursor()).last_uid == last


@pytest.mark.parametrize("kind", ["fake", *SERVERS])
async def test_fetch_headers_gives_the_header_block_and_size_without_the_body(request, kind):
    raw = _big_mail(1).replace(b"\n", b"\r\n")
    if kind == "fake":
        server = MemoryServer()
        server.create_folder("box")
        server.append("box", raw)
        box = server.factory()(request.getfixturevalue("imap_server").mailbox_settings("m", "box"))
    else:
        mail_server = server_named(request, kind)
        folder = new_folder(mail_server)
        mail_server.append(folder, raw)
        box = ImapMailbox(mail_server.mailbox_settings("m", folder))
    await box.connect()
    try:
        await box.select(box.settings.folder)
        uids = await box.uids_above(0)
        assert await box.larger_than(uids, LIMIT) == set(uids)
        (mail,) = await box.fetch_headers(uids)
    finally:
        await box.close()
    header = raw[: raw.index(b"\r\n\r\n") + 4]
    assert (mail.uid, mail.raw, mail.size, mail.headers_only) == (uids[0], header, len(raw), True)
    assert mail.internal_date is not None
    if kind == "fake":
        assert server.body_fetches == []
