"""Logged-in IMAP connections kept between polls, one set per account.

A login is the dearest step of a poll that finds a few mails: a TLS handshake and a
password check on the server (pymap hashes for about 300 ms of CPU; over a WAN the
round trips alone take as long), paid again by every mailbox at every pass. So a
worker keeps the connections its polls end with, by account (host, port, security,
CA, user and credentials), and the next poll of any folder of that account takes one
and SELECTs its own folder: a SELECT that finds the connection dropped is sent again on
another kept one or a new login (no NOOP first). A connection goes back only when
every call on it returned; one that failed, or whose call was cancelled, is closed.

A connection is opened only when none of its account is kept, so a worker holds no
more per account than its polls used at once (its threads), as it did before; at most
``MAX_IDLE_PER_ACCOUNT`` wait per account and ``MAX_KEPT`` in all (the least recently
given back are logged out first: 1,000 one-folder accounts would otherwise keep 1,000
sockets, past the default limit of open files), each for at most ``KEEP_S`` (far under the
30 minutes RFC 3501 lets a server keep an idle session). ``aclose`` logs them out when the
worker stops.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import SecretStr
from redis.exceptions import RedisError

from mailroom.adapters.imap import FetchedMail, ImapMailbox, Mailbox, MailboxFactory
from mailroom.errors import MailboxUnavailable
from mailroom.intake.account_slots import AccountSlots, SlotKeeper
from mailroom.settings import MailboxSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Connections kept per account when no poll uses them: a worker's threads (8 by default),
#: so polls that end together and the next ones that start together need no new login.
MAX_IDLE_PER_ACCOUNT = 8
#: Connections kept in all, whatever their accounts: a process's share of the open files.
MAX_KEPT = 64
#: How long a kept connection may wait for its next poll, in seconds.
KEEP_S = 300.0

#: The settings that make two mailboxes one login.
_ACCOUNT_FIELDS = {"host", "port", "security", "ca_file", "username", "password", "auth", "oauth"}


def account_key(settings: MailboxSettings) -> str:
    """A digest of what the login depends on (credentials included, never kept in clear)."""
    fields = settings.model_dump(include=_ACCOUNT_FIELDS | {"timeout_s"})

    def reveal(value: object) -> str:
        return value.get_secret_value() if isinstance(value, SecretStr) else str(value)

    text = json.dumps(fields, default=reveal, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Kept:
    mailbox: Mailbox
    since: float


class ConnectionPool:
    """A ``MailboxFactory`` whose mailboxes log in once per account and are given back."""

    def __init__(
        self,
        connect: MailboxFactory = ImapMailbox,
        *,
        keep_s: float = KEEP_S,
        max_idle: int = MAX_IDLE_PER_ACCOUNT,
        max_kept: int = MAX_KEPT,
        slots: AccountSlots | None = None,
    ) -> None:
        self._connect = connect
        #: The accounts' connection slots shared with every process; None: no cap.
        self.slots = slots
        self._keeper = SlotKeeper(slots) if slots is not None else None
        self.keep_s = keep_s
        self.max_idle = max_idle
        self.max_kept = max_kept
        self._kept: dict[str, list[_Kept]] = {}
        self._stale: list[Mailbox] = []
        self.closed = False

    def __call__(self, settings: MailboxSettings) -> Mailbox:
        return PooledMailbox(self, settings)

    def open(self, settings: MailboxSettings) -> Mailbox:
        mailbox = self._connect(settings)
        if self._keeper is None:
            return mailbox
        return SlottedMailbox(mailbox, self._keeper, account_key(settings))

    def take(self, key: str) -> Mailbox | None:
        """The connection of this account given back last, if one was kept long enough ago."""
        kept = self._kept.get(key, [])
        now = time.monotonic()
        while kept:
            entry = kept.pop()
            if now - entry.since < self.keep_s:
                return entry.mailbox
            self._stale.append(entry.mailbox)
        return None

    async def give_back(self, key: str, mailbox: Mailbox) -> None:
        """Keep ``mailbox`` for the next poll; log out those over the limits."""
        if self.closed:
            await mailbox.close()
            return
        now = time.monotonic()
        self._kept.setdefault(key, []).append(_Kept(mailbox, now))
        stale, self._stale = self._stale, []
        for account, kept in list(self._kept.items()):
            fresh = [k for k in kept if now - k.since < self.keep_s][-self.max_idle :]
            stale += [k.mailbox for k in kept if k not in fresh]
            if fresh:
                self._kept[account] = fresh
            else:
                del self._kept[account]
        stale += self._evict_least_recent()
        await _close_all(stale)

    def _evict_least_recent(self) -> list[Mailbox]:
        """Take out the connections over ``max_kept``, those given back longest ago."""
        kept = sorted(
            (
                (entry.since, account, entry)
                for account, entries in self._kept.items()
                for entry in entries
            ),
            key=lambda item: item[0],
        )
        evicted = []
        for _, account, entry in kept[: max(0, len(kept) - self.max_kept)]:
            self._kept[account].remove(entry)
            if not self._kept[account]:
                del self._kept[account]
            evicted.append(entry.mailbox)
        return evicted

    async def aclose(self) -> None:
        """Log every kept connection out; later give-backs close theirs."""
        self.closed = True
        kept = [k.mailbox for entries in self._kept.values() for k in entries]
        stale, self._stale, self._kept = self._stale, [], {}
        await _close_all(kept + stale)
        if self._keeper is not None:
            await self._keeper.aclose()


async def _close_all(mailboxes: list[Mailbox]) -> None:
    # close() never raises (Mailbox protocol): a failed logout is logged by the adapter.
    await asyncio.gather(*(mailbox.close() for mailbox in mailboxes))


class PooledMailbox:
    """A ``Mailbox`` on a kept connection of its account, or a new one; given back at close."""

    def __init__(self, pool: ConnectionPool, settings: MailboxSettings) -> None:
        self.settings = settings
        self._pool = pool
        self._key = account_key(settings)
        self._inner: Mailbox | None = None
        #: Every call on the connection returned: it may serve the next poll.
        self._clean = False
        #: Taken from the pool and not used yet: its SELECT is its health check.
        self._unchecked = False

    def _require(self) -> Mailbox:
        if self._inner is None:
            raise RuntimeError("PooledMailbox used before connect()")
        return self._inner

    async def _run(self, call: Awaitable[T]) -> T:
        self._clean = False
        result = await call
        self._clean = True
        return result

    async def connect(self) -> None:
        kept = self._pool.take(self._key)
        if kept is None:
            await self._open()
            return
        # Not checked here: the poll's next command, its SELECT, tells a connection the server
        # dropped (``select``), and a NOOP first would cost every poll a round trip.
        self._inner = kept  # from here close() ends it, should this poll be cancelled
        self._clean = True
        self._unchecked = True
        if isinstance(kept, ImapMailbox):
            kept.settings = self.settings  # its log lines name the mailbox it now serves

    async def _open(self) -> None:
        self._inner = self._pool.open(self.settings)
        await self._run(self._inner.connect())

    async def check_health(self) -> None:
        if self._unchecked:  # a kept connection: the SELECT that follows checks it
            return
        await self._run(self._require().check_health())

    async def select(self, folder: str) -> int:
        while self._unchecked:
            self._unchecked = False
            kept = self._require()
            try:
                return await self._run(kept.select(folder))
            except MailboxUnavailable as exc:  # the server ended it meanwhile: take or log in anew
                logger.debug("Kept IMAP connection for %s is gone: %s", self.settings.name, exc)
                self._inner = None
                await kept.close()
            if (again := self._pool.take(self._key)) is not None:
                self._inner, self._unchecked = again, True
                continue
            await self._open()
        return await self._run(self._require().select(folder))

    async def uids_above(self, uid: int) -> list[int]:
        return await self._run(self._require().uids_above(uid))

    async def larger_than(self, uids: list[int], size: int) -> set[int]:
        return await self._run(self._require().larger_than(uids, size))

    async def fetch(self, uids: list[int]) -> list[FetchedMail]:
        return await self._run(self._require().fetch(uids))

    async def fetch_headers(self, uids: list[int]) -> list[FetchedMail]:
        return await self._run(self._require().fetch_headers(uids))

    async def add_flags(self, uids: list[int], flag: str) -> None:
        await self._run(self._require().add_flags(uids, flag))

    async def move(self, uids: list[int], folder: str) -> None:
        await self._run(self._require().move(uids, folder))

    async def close(self) -> None:
        inner, self._inner = self._inner, None
        if inner is None:
            return
        if self._clean:
            await self._pool.give_back(self._key, inner)
        else:
            await inner.close()


#: How long a new login waits for a slot of its account before the poll fails (and backs off).
SLOT_WAIT_S = 2.0
#: Wait between two looks for a free slot, in seconds.
SLOT_RETRY_S = 0.1


class SlottedMailbox:
    """A ``Mailbox`` that holds one of its account's connection slots while it is open.

    The slot is taken before the login (a poll waits ``SLOT_WAIT_S`` for one, then fails as
    an unreachable server does), renewed by the process's ``SlotKeeper`` while the
    connection is open (in use or kept) and given back when it closes.
    """

    def __init__(self, inner: Mailbox, keeper: SlotKeeper, account: str) -> None:
        self.settings = getattr(inner, "settings", None)
        self._inner = inner
        self._keeper = keeper
        self._slots = keeper.slots
        self._account = account
        self._holder = f"poll-{uuid.uuid4().hex}"
        self._held = False

    async def connect(self) -> None:
        try:
            self._held = await self._take_slot()
        except RedisError as exc:  # no count without Redis: log in anyway, the server caps
            logger.warning("IMAP connection slots unavailable (%r): logging in uncounted", exc)
        try:
            await self._inner.connect()
        except BaseException:
            await self._give_back()
            raise

    async def _take_slot(self) -> bool:
        deadline = time.monotonic() + SLOT_WAIT_S
        # One slot stays free for a watcher: NOTIFY watches a whole account on one connection.
        room = self._slots.limit - 1
        while not await self._slots.take(self._account, self._holder, limit=room):
            if time.monotonic() >= deadline:
                raise MailboxUnavailable(
                    f"the account's {self._slots.limit} IMAP connections are in use "
                    "(intake.max_connections_per_account)"
                )
            await asyncio.sleep(SLOT_RETRY_S)
        self._keeper.hold(self._account, self._holder)
        return True

    async def _give_back(self) -> None:
        if self._held:
            self._held = False
            self._keeper.release(self._holder)
            try:
                await self._slots.give_back(self._account, self._holder)
            except Exception as exc:  # Redis away: the slot's lease runs out by itself
                logger.warning("IMAP connection slot not given back: %r", exc)

    async def check_health(self) -> None:
        await self._inner.check_health()

    async def select(self, folder: str) -> int:
        return await self._inner.select(folder)

    async def uids_above(self, uid: int) -> list[int]:
        return await self._inner.uids_above(uid)

    async def larger_than(self, uids: list[int], size: int) -> set[int]:
        return await self._inner.larger_than(uids, size)

    async def fetch(self, uids: list[int]) -> list[FetchedMail]:
        return await self._inner.fetch(uids)

    async def fetch_headers(self, uids: list[int]) -> list[FetchedMail]:
        return await self._inner.fetch_headers(uids)

    async def add_flags(self, uids: list[int], flag: str) -> None:
        await self._inner.add_flags(uids, flag)

    async def move(self, uids: list[int], folder: str) -> None:
        await self._inner.move(uids, folder)

    async def close(self) -> None:
        try:
            await self._inner.close()
        finally:
            await self._give_back()
