"""An in-memory ``Mailbox`` for unit tests: folders in a dict, with switches for failures.

It sits beside the real client as Dramatiq's stub broker sits beside its real brokers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from mailroom.adapters.imap.mailbox import FetchedMail, MailboxFactory, filter_uids_above
from mailroom.errors import (
    MailboxCommandFailed,
    MailboxFolderMissing,
    MailboxLoginRejected,
    MailboxUnavailable,
)
from mailroom.settings import MailboxSettings


@dataclass
class MemoryFolder:
    uidvalidity: int
    messages: dict[int, FetchedMail]
    next_uid: int = 1
    #: Flags set on each UID (fetching sets none, like BODY.PEEK[]).
    flags: dict[int, set[str]] = field(default_factory=dict)


class InMemoryMailbox:
    """A fake ``Mailbox`` over a shared dict of folders, with switches for failures.

    Unit tests share one ``MemoryServer`` between the factory's mailboxes, append
    to it, and flip ``down`` or ``fail_fetch``.
    """

    def __init__(self, server: MemoryServer, settings: MailboxSettings) -> None:
        self.server = server
        self.settings = settings
        self._folder: MemoryFolder | None = None
        self.connected = False

    async def connect(self) -> None:
        if self.server.down:
            raise MailboxUnavailable("connection refused")
        if self.settings.password.get_secret_value() != self.server.password:
            raise MailboxLoginRejected("[AUTHENTICATIONFAILED] Invalid credentials")
        self.connected = True
        self.server.connections += 1

    async def check_health(self) -> None:
        if not self.connected or self.server.down:
            raise MailboxUnavailable("connection lost")

    async def select(self, folder: str) -> int:
        if folder not in self.server.folders:
            raise MailboxFolderMissing(f"SELECT {folder!r}: [NONEXISTENT] no such folder")
        self._folder = self.server.folders[folder]
        return self._folder.uidvalidity

    async def uids_above(self, uid: int) -> list[int]:
        assert self._folder is not None
        found = [u for u in self._folder.messages if u > uid]
        if not found and self._folder.messages:
            found = [max(self._folder.messages)]  # the real servers' ``N:*`` quirk
        return filter_uids_above(found, uid)

    async def larger_than(self, uids: list[int], size: int) -> set[int]:
        assert self._folder is not None
        messages = self._folder.messages
        return {u for u in uids if u in messages and len(messages[u].raw) > size}

    async def fetch(self, uids: list[int]) -> list[FetchedMail]:
        assert self._folder is not None
        if self.server.fail_fetch:
            raise MailboxUnavailable("connection reset during FETCH")
        found = [self._folder.messages[u] for u in sorted(uids) if u in self._folder.messages]
        self.server.body_fetches.extend(mail.uid for mail in found)
        return found

    async def fetch_headers(self, uids: list[int]) -> list[FetchedMail]:
        assert self._folder is not None
        if self.server.fail_fetch:
            raise MailboxUnavailable("connection reset during FETCH")
        found = [self._folder.messages[u] for u in sorted(uids) if u in self._folder.messages]
        return [
            FetchedMail(
                mail.uid,
                _header_block(mail.raw),
                mail.internal_date,
                headers_only=True,
                size=len(mail.raw),
            )
            for mail in found
        ]

    async def add_flags(self, uids: list[int], flag: str) -> None:
        assert self._folder is not None
        for uid in uids:
            if uid in self._folder.messages:
                self._folder.flags.setdefault(uid, set()).add(flag)

    async def move(self, uids: list[int], folder: str) -> None:
        assert self._folder is not None
        if folder not in self.server.folders:
            raise MailboxCommandFailed(f"UID MOVE to {folder!r}: [TRYCREATE] no such folder")
        source = self._folder
        for uid in sorted(uids):
            mail = source.messages.pop(uid, None)
            if mail is not None:
                moved = self.server.append(folder, mail.raw, mail.internal_date)
                self.server.folders[folder].flags[moved] = source.flags.pop(uid, set())

    async def close(self) -> None:
        self.connected = False


def _header_block(raw: bytes) -> bytes:
    """The header block of ``raw`` with the empty line that ends it, as BODY[HEADER] gives it."""
    for end in (b"\r\n\r\n", b"\n\n"):
        cut = raw.find(end)
        if cut >= 0:
            return raw[: cut + len(end)]
    return raw


class MemoryServer:
    """Folders of the fake IMAP server, keyed by name."""

    def __init__(self, *, password: str = "demopass") -> None:
        self.password = password
        self.folders: dict[str, MemoryFolder] = {}
        self.down = False
        self.fail_fetch = False
        self.connections = 0
        #: UIDs whose whole mail was fetched, in order (a headers-only fetch adds none).
        self.body_fetches: list[int] = []

    def create_folder(self, name: str, *, uidvalidity: int = 1, first_uid: int = 1) -> None:
        self.folders[name] = MemoryFolder(uidvalidity, {}, first_uid)

    def append(self, folder: str, raw: bytes, internal_date: datetime | None = None) -> int:
        box = self.folders[folder]
        uid = box.next_uid
        box.next_uid += 1
        box.messages[uid] = FetchedMail(uid, raw, internal_date or datetime.now(UTC))
        return uid

    def flags(self, folder: str, uid: int) -> set[str]:
        return set(self.folders[folder].flags.get(uid, set()))

    def factory(self) -> MailboxFactory:
        return lambda settings: InMemoryMailbox(self, settings)
