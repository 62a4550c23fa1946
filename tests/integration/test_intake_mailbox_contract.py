"""One contract for the mailbox port, met by the in-memory fake and by imapclient on pymap and
on Dovecot (skipped where Dovecot is not installed)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import uuid

import pytest
from imapclient import IMAPClient
from imapclient.exceptions import LoginError

from mailroom.adapters.imap import ImapMailbox
from mailroom.adapters.imap.client import TEMPORARY_LOGIN_CODES, _translate_errors
from mailroom.adapters.imap.memory import MemoryServer
from mailroom.devtools.dovecot import DovecotServer
from mailroom.errors import (
    MailboxCertificateRejected,
    MailboxCommandFailed,
    MailboxFolderMissing,
    MailboxLoginRejected,
    MailboxUnavailable,
)
from tests.fixtures.imap import SERVERS, make_mail, new_folder, on_every_server, server_named

pytestmark = pytest.mark.integration


@pytest.fixture(params=["fake", *SERVERS])
def mailbox_with_three_mails(request):
    mails = [make_mail(n) for n in range(3)]
    if request.param == "fake":
        server = MemoryServer()
        server.create_folder("box", uidvalidity=42, first_uid=101)
        for raw in mails:
            server.append("box", raw)
        settings = request.getfixturevalue("imap_server").mailbox_settings("m", "box")
        return server.factory()(settings), mails
    mail_server = server_named(request, request.param)
    folder = new_folder(mail_server)
    mail_server.append(folder, *mails)
    return ImapMailbox(mail_server.mailbox_settings("m", folder)), mails


async def test_mailbox_reads_new_uids_in_order_and_fetches_them(mailbox_with_three_mails):
    box, mails = mailbox_with_three_mails
    await box.connect()
    try:
        await box.check_health()
        uidvalidity = await box.select(box.settings.folder)
        assert uidvalidity > 0
        uids = await box.uids_above(0)
        assert len(uids) == 3 and uids == sorted(uids)
        assert await box.uids_above(uids[-1]) == [], "the N:* quirk is filtered"
        assert await box.uids_above(uids[0]) == uids[1:]
        fetched = await box.fetch([uids[2], uids[0]])
        assert [m.uid for m in fetched] == [uids[0], uids[2]]
        assert [m.raw.replace(b"\r\n", b"\n") for m in fetched] == [
            mails[0].replace(b"\r\n", b"\n"),
            mails[2].replace(b"\r\n", b"\n"),
        ]
        assert all(m.internal_date is not None and m.internal_date.tzinfo for m in fetched)
        with pytest.raises(MailboxFolderMissing):
            await box.select("no-such-folder")
    finally:
        await box.close()


async def test_larger_than_names_the_mails_over_a_size(mailbox_with_three_mails):
    box, _ = mailbox_with_three_mails
    await box.connect()
    try:
        await box.select(box.settings.folder)
        uids = await box.uids_above(0)
        sizes = {m.uid: len(m.raw) for m in await box.fetch(uids)}
        smallest = min(sizes.values())
        assert await box.larger_than(uids, smallest - 1) == set(uids)
        assert await box.larger_than(uids, max(sizes.values())) == set()
        bigger = {uid for uid, size in sizes.items() if size > smallest}
        assert await box.larger_than(uids, smallest) == bigger
        assert await box.larger_than(uids[:1], 0) == {uids[0]}, "only the UIDs asked about"
    finally:
        await box.close()


@on_every_server
async def test_fetched_mail_stays_unread(mail_server, mail_folder):
    uids = mail_server.append(mail_folder, *(make_mail(n) for n in range(2)))
    box = ImapMailbox(mail_server.mailbox_settings("m", mail_folder))
    await box.connect()
    try:
        await box.select(mail_folder)
        fetched = await box.fetch(uids)
    finally:
        await box.close()
    assert [m.uid for m in fetched] == uids and all(m.raw for m in fetched)
    with mail_server.client() as other:
        other.select_folder(mail_folder, readonly=True)
        flags = other.get_flags(uids)
    assert all(b"\\Seen" not in flags[uid] for uid in uids), flags


def _sends_at_once(box: ImapMailbox) -> bool:
    """Nagle's algorithm is off: a command written in pieces is not held back for an ACK."""
    assert box._client is not None
    return bool(box._client.socket().getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


@on_every_server
async def test_commands_are_sent_at_once(mail_server, mail_folder):
    # imapclient writes a SEARCH as the command, then its CRLF: with Nagle on, the CRLF
    # waited for the server's delayed ACK, about 40 ms for every SEARCH.
    box = ImapMailbox(mail_server.mailbox_settings("m", mail_folder))
    await box.connect()
    try:
        assert _sends_at_once(box)
    finally:
        await box.close()


@on_every_server
async def test_fetch_of_mail_another_session_expunged_returns_the_rest(mail_server, mail_folder):
    uids = mail_server.append(mail_folder, *(make_mail(n) for n in range(3)))
    box = ImapMailbox(mail_server.mailbox_settings("m", mail_folder))
    await box.connect()
    try:
        await box.select(mail_folder)
        assert await box.uids_above(0) == uids
        with mail_server.client() as other:
            other.select_folder(mail_folder)
            other.delete_messages([uids[1]])
            other.expunge()
        # Dovecot leaves the expunged mail out; pymap may still serve it, or list it in a
        # SEARCH, to a session it has not told yet (RFC 3501 allows both). Neither is an error.
        fetched = [m.uid for m in await box.fetch(uids)]
        assert fetched in ([uids[0], uids[2]], uids)
        assert await box.larger_than(uids, 0) <= set(uids)
    finally:
        await box.close()


@on_every_server
async def test_an_empty_poll_knows_from_uidnext_and_the_next_search_sees_new_mail(
    mail_server, mail_folder, monkeypatch
):
    (uid,) = mail_server.append(mail_folder, make_mail(1))
    searches: list[object] = []
    search = IMAPClient.search

    def counted(self, *args, **kwargs):
        searches.append(args)
        return search(self, *args, **kwargs)

    monkeypatch.setattr(IMAPClient, "search", counted)
    box = ImapMailbox(mail_server.mailbox_settings("m", mail_folder))
    await box.connect()
    try:
        await box.select(mail_folder)
        assert await box.uids_above(uid) == []
        assert searches == [], "the SELECT's UIDNEXT said nothing is above the UID"
        assert await box.uids_above(uid) == []
        assert len(searches) == 1, "UIDNEXT serves the first call after the SELECT only"
        await box.select(mail_folder)
        await box.larger_than([uid], 10**9)
        assert await box.uids_above(uid) == []
        assert len(searches) == 3, "nor a call after another command"
        (later,) = mail_server.append(mail_folder, make_mail(2))
        await box.select(mail_folder)
        assert await box.uids_above(uid) == [later]
        assert len(searches) == 4
    finally:
        await box.close()


@pytest.fixture
def tls_server(request, mail_server):
    """This run's server with STARTTLS and a self-signed certificate (``.tls``): Dovecot
    offers it on its one port, pymap on a second server."""
    if isinstance(mail_server, DovecotServer):
        return mail_server
    return request.getfixturevalue("imap_tls_server")


@on_every_server
async def test_starttls_with_the_servers_ca_connects(tls_server):
    cert_file, _ = tls_server.tls
    folder = f"tls{uuid.uuid4().hex[:8]}"
    tls_server.create_folder(folder)
    tls_server.append(folder, make_mail(1))
    box = ImapMailbox(
        tls_server.mailbox_settings("m", folder, security="starttls", ca_file=cert_file)
    )
    await box.connect()
    try:
        await box.select(folder)
        assert len(await box.uids_above(0)) == 1
        assert box._client._imap.sock.version().startswith("TLS")
        assert _sends_at_once(box)
    finally:
        await box.close()


@on_every_server
async def test_starttls_refuses_a_certificate_it_cannot_verify(tls_server):
    box = ImapMailbox(tls_server.mailbox_settings("m", "INBOX", security="starttls"))
    try:
        with pytest.raises(MailboxCertificateRejected, match="certificate"):
            await box.connect()
    finally:
        await box.close()


@pytest.fixture
async def imaps_port(tls_server):
    """Implicit TLS (IMAPS): Dovecot's own port; in front of pymap, which offers only
    STARTTLS, a relay that terminates TLS with the server's certificate and passes the bytes
    on in the clear."""
    if isinstance(tls_server, DovecotServer):
        yield tls_server.imaps_port
        return
    cert_file, key_file = tls_server.tls
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    pipes: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", tls_server.port)
        for task in (pipe(client_r, server_w), pipe(server_r, client_w)):
            pipes.add(asyncio.create_task(task))

    server = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


@on_every_server
async def test_implicit_tls_with_the_servers_ca_reads_the_folder(tls_server, imaps_port):
    cert_file, _ = tls_server.tls
    folder = f"ssl{uuid.uuid4().hex[:8]}"
    tls_server.create_folder(folder)
    tls_server.append(folder, make_mail(1), make_mail(2))
    settings = tls_server.mailbox_settings("m", folder, security="ssl", ca_file=cert_file)
    box = ImapMailbox(settings.model_copy(update={"port": imaps_port}))
    await box.connect()
    try:
        await box.select(folder)
        uids = await box.uids_above(0)
        fetched = await box.fetch(uids)
        subjects = [line for m in fetched for line in m.raw.splitlines() if b"Subject:" in line]
        assert subjects == [b"Subject: mail 1", b"Subject: mail 2"]
        assert box._client._imap.sock.version().startswith("TLS")
        assert _sends_at_once(box)
    finally:
        await box.close()


@on_every_server
async def test_implicit_tls_refuses_a_certificate_it_cannot_verify(tls_server, imaps_port):
    settings = tls_server.mailbox_settings("m", "INBOX", security="ssl")
    box = ImapMailbox(settings.model_copy(update={"port": imaps_port}))
    try:
        with pytest.raises(MailboxCertificateRejected, match="certificate"):
            await box.connect()
    finally:
        await box.close()


@on_every_server
async def test_a_login_refused_for_too_many_connections_is_retryable(mail_server, mail_folder):
    # Dovecot refuses an 11th connection of one user from one address ([LIMIT]); pymap has
    # no limit. Either way it is never taken for wrong credentials, which would stop intake.
    boxes = [ImapMailbox(mail_server.mailbox_settings(f"m{i}", mail_folder)) for i in range(11)]
    try:
        await asyncio.gather(*(box.connect() for box in boxes[:-1]))
        with contextlib.suppress(MailboxUnavailable):
            await boxes[-1].connect()
            await boxes[-1].select(mail_folder)
    finally:
        await asyncio.gather(*(box.close() for box in boxes))


@pytest.mark.parametrize("code", TEMPORARY_LOGIN_CODES)
def test_login_refusals_with_a_temporary_response_code_are_retryable(code):
    with pytest.raises(MailboxUnavailable, match="refused for now"):
        with _translate_errors("connect m"):
            raise LoginError(f"b'{code} Try again later'")
    with pytest.raises(MailboxLoginRejected):
        with _translate_errors("connect m"):
            raise LoginError("b'[AUTHENTICATIONFAILED] Authentication failed.'")


class FolderView:
    """What is in a folder and how it is flagged, read beside the mailbox under test."""

    def __init__(self, request: pytest.FixtureRequest, kind: str) -> None:
        self.fake = MemoryServer() if kind == "fake" else None
        self.server = None if self.fake else server_named(request, kind)
        self.settings = request.getfixturevalue("imap_server").mailbox_settings("m", "x")
        self.kind = kind

    def new_folder(self) -> str:
        if self.fake is None:
            return new_folder(self.server)
        name = f"t{uuid.uuid4().hex[:10]}"
        self.fake.create_folder(name)
        return name

    def append(self, folder: str, *mails: bytes) -> list[int]:
        if self.fake is None:
            return self.server.append(folder, *mails)
        return [self.fake.append(folder, raw) for raw in mails]

    def mailbox(self, folder: str):
        settings = self.settings.model_copy(update={"folder": folder})
        if self.fake is None:
            settings = self.server.mailbox_settings("m", folder)
            return ImapMailbox(settings)
        return self.fake.factory()(settings)

    def uids(self, folder: str) -> list[int]:
        if self.fake is None:
            return self.server.uids(folder)
        return sorted(self.fake.folders[folder].messages)

    def flags(self, folder: str, uids: list[int]) -> dict[int, set[str]]:
        if self.fake is not None:
            return {uid: self.fake.flags(folder, uid) for uid in uids}
        with self.server.client() as other:
            other.select_folder(folder, readonly=True)
            found = other.get_flags(uids)
        return {uid: {flag.decode() for flag in found.get(uid, ())} for uid in uids}


@pytest.fixture(params=["fake", *SERVERS])
def folders(request):
    return FolderView(request, request.param)


async def test_flags_are_set_on_the_uids_only_and_setting_them_again_is_harmless(folders):
    folder = folders.new_folder()
    uids = folders.append(folder, *(make_mail(n) for n in range(3)))
    box = folders.mailbox(folder)
    await box.connect()
    try:
        await box.select(folder)
        await box.add_flags(uids[:2], "\\Seen")
        await box.add_flags(uids[:2], "\\Seen")
        await box.add_flags([uids[1]], "\\Flagged")
        await box.add_flags([uids[2] + 100], "\\Seen")  # no such UID: nothing to do
    finally:
        await box.close()
    flags = folders.flags(folder, uids)
    assert ["\\Seen" in flags[uid] for uid in uids] == [True, True, False], flags
    assert ["\\Flagged" in flags[uid] for uid in uids] == [False, True, False], flags


async def test_a_keyword_is_set_where_the_server_keeps_keywords_and_refused_where_not(folders):
    folder = folders.new_folder()
    uids = folders.append(folder, make_mail(0))
    box = folders.mailbox(folder)
    await box.connect()
    try:
        await box.select(folder)
        if folders.kind == "pymap":
            # pymap's PERMANENTFLAGS has no \*: it would answer OK and forget the keyword.
            with pytest.raises(MailboxCommandFailed, match="keeps only"):
                await box.add_flags(uids, "$Mailroom")
            return
        await box.add_flags(uids, "$Mailroom")
    finally:
        await box.close()
    assert "$Mailroom" in folders.flags(folder, uids)[uids[0]]


async def test_move_moves_the_uids_once_and_a_second_move_finds_nothing(folders):
    folder, target = folders.new_folder(), folders.new_folder()
    uids = folders.append(folder, *(make_mail(n) for n in range(3)))
    box = folders.mailbox(folder)
    await box.connect()
    try:
        await box.select(folder)
        await box.move(uids[:2], target)
        await box.move(uids[:2], target)  # already gone: no error, nothing copied again
        assert await box.uids_above(0) == uids[2:]
        assert [m.uid for m in await box.fetch(uids)] == uids[2:]
    finally:
        await box.close()
    assert folders.uids(folder) == uids[2:]
    assert len(folders.uids(target)) == 2


async def test_move_to_a_folder_that_does_not_exist_fails_and_moves_nothing(folders):
    folder = folders.new_folder()
    uids = folders.append(folder, make_mail(0))
    box = folders.mailbox(folder)
    await box.connect()
    try:
        await box.select(folder)
        with pytest.raises(MailboxCommandFailed, match="MOVE"):
            await box.move(uids, "no-such-folder")
        await box.check_health()  # the connection is fine
    finally:
        await box.close()
    assert folders.uids(folder) == uids


@on_every_server
async def test_move_without_the_move_capability_copies_deletes_and_expunges_those_uids(
    mail_server, mail_folder, monkeypatch
):
    target = new_folder(mail_server)
    uids = mail_server.append(mail_folder, *(make_mail(n) for n in range(3)))
    with mail_server.client() as other:  # someone else's deleted mail is not expunged by us
        other.select_folder(mail_folder)
        other.add_flags([uids[2]], [b"\\Deleted"])
    capable = IMAPClient.has_capability
    monkeypatch.setattr(
        IMAPClient, "has_capability", lambda self, name: name != "MOVE" and capable(self, name)
    )
    box = ImapMailbox(mail_server.mailbox_settings("m", mail_folder))
    await box.connect()
    try:
        await box.select(mail_folder)
        await box.move(uids[:2], target)
        await box.move(uids[:2], target)
    finally:
        await box.close()
    assert mail_server.uids(mail_folder) == uids[2:]
    assert len(mail_server.uids(target)) == 2
