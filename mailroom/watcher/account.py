"""Watch the folders of one account and say which of them got new mail.

Where the server offers NOTIFY (RFC 5465) one connection watches every folder of the
account: the server sends a folder's STATUS when mail comes or goes, and a higher UIDNEXT
is news; after ``intake.watch_check_s`` of silence a NOOP asks for news the server did not
send (``WatchConnection.listen``: Dovecot stops sending it by itself now and then). Elsewhere each folder gets a connection of its own in IDLE (RFC 2177), as many
as ``watch_connections_per_account`` and the account's connection slots allow; a folder
past them is read at the scheduler's passes only. Each connection holds a slot of the
account (``intake.account_slots``), so watchers and polls together stay under the
server's limit. A connection that fails is opened again after a backoff; meanwhile the
scheduler's passes read the folder, so nothing depends on the watcher.

Every (re)connect announces each of its folders once, even one whose poll is marked
queued (a watcher killed between its mark and its send leaves such a mark): mail that came
while nobody watched is read at once, not at the next pass.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

from mailroom.adapters.imap.watch import FolderNews, WatchConnection
from mailroom.backoff import backoff
from mailroom.errors import AppError, PermanentError
from mailroom.intake.account_slots import SlotKeeper
from mailroom.settings import IntakeSettings, MailboxSettings

logger = logging.getLogger(__name__)

#: First wait before a failed watch connection is opened again, in seconds.
INITIAL_BACKOFF_S = 1.0

#: Called with the folders of the account that got news; ``catch_up``: a (re)connect's.
Announce = Callable[[list[str], bool], Awaitable[None]]


class AccountWatch:
    """The watch of one account's ``folders``, given the settings of one of its mailboxes."""

    def __init__(
        self,
        account: str,
        login: MailboxSettings,
        folders: list[str],
        *,
        intake: IntakeSettings,
        keeper: SlotKeeper,
        announce: Announce,
    ) -> None:
        self.account = account
        self.login = login
        self.folders = folders
        self.intake = intake
        #: Renews the slots of the watcher's connections, all in one round trip.
        self.keeper = keeper
        self.slots = keeper.slots
        self.announce = announce
        #: Folders with a live watch (NOTIFY or IDLE) right now.
        self.watching: set[str] = set()
        self.connections = 0
        #: ``NOTIFY`` or ``IDLE`` once the first connection told what the server offers.
        self.mode = ""

    async def run(self) -> None:
        """Watch until cancelled: NOTIFY where offered, IDLE per folder otherwise."""
        failures = 0
        while True:
            holder = f"watch-{uuid.uuid4().hex}"
            connection: WatchConnection | None = None
            try:
                connection = await self._open(holder)
                if connection is None:  # no slot free now: try again after a lease
                    await asyncio.sleep(self.intake.watch_lease_s)
                    continue
                failures = 0
                self.mode = "NOTIFY" if connection.offers_notify else "IDLE"
                if connection.offers_notify:
                    await self._notify(connection)
                else:
                    await self._idle_all(connection)
            except (AppError, RedisError) as exc:
                delay = self._backoff(failures, exc)
                failures += 1
                logger.warning(
                    "IMAP watch of %s (%s folder(s)) failed: %s; again in %.0f s",
                    self.login.username,
                    len(self.folders),
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
            finally:
                if connection is not None:
                    await self._close(connection, holder)

    def _backoff(self, failures: int, exc: Exception) -> float:
        cap = self.intake.watch_max_backoff_s
        if isinstance(exc, PermanentError):  # a refused login: the polls block the mailbox
            return cap
        return backoff(failures, base=INITIAL_BACKOFF_S, cap=cap)

    async def _open(self, holder: str) -> WatchConnection | None:
        if not await self.slots.take(self.account, holder):
            return None
        connection = WatchConnection(self.login)
        self.connections += 1
        self.keeper.hold(self.account, holder, on_lost=lambda: self._lost(connection))
        try:
            await connection.open()
        except BaseException:
            await self._close(connection, holder)
            raise
        return connection

    async def _close(self, connection: WatchConnection, holder: str) -> None:
        self.connections -= 1
        self.keeper.release(holder)
        try:
            await connection.close()
        finally:
            try:
                await self.slots.give_back(self.account, holder)
            except Exception as exc:  # Redis away: the slot's lease runs out by itself
                logger.debug("IMAP watch slot not given back: %r", exc)

    async def _lost(self, connection: WatchConnection) -> None:
        """A renewal came too late (a stalled process, Redis away for longer than the lease) and
        found the slot given to someone else, the account's slots all held: the connection goes,
        or the account would have more connections than its cap. Its watch fails and is opened
        again once a slot is free; the scheduler's passes read its folders meanwhile."""
        logger.warning(
            "IMAP watch of %s: its connection slot ran out before it was renewed and "
            "the account's slots are taken; closing the connection",
            self.login.username,
        )
        await connection.close()

    async def _notify(self, connection: WatchConnection) -> None:
        known = await connection.notify(self.folders)
        self.watching = set(self.folders)
        try:
            await self.announce(list(self.folders), True)  # what came while nobody watched
            async for news in connection.listen(self.check_s):
                if news.folder is None or news.folder not in known or news.uidnext is None:
                    continue
                if news.uidnext > known[news.folder]:
                    known[news.folder] = news.uidnext
                    await self.announce([news.folder], False)
        finally:
            self.watching = set()

    @property
    def intake_idle_s(self) -> float:
        """How long an IDLE waits without a word before it checks the connection."""
        return self.login.idle_timeout_s

    @property
    def check_s(self) -> float:
        """How long a NOTIFY watch waits without a word before it asks the server for news."""
        return min(self.intake.watch_check_s, self.login.idle_timeout_s)

    async def _idle_all(self, first: WatchConnection) -> None:
        """One IDLE connection per folder, up to the account's watch connections."""
        room = self.intake.watch_connections_per_account
        watched = self.folders[:room]
        if len(watched) < len(self.folders):
            logger.info(
                "IMAP watch of %s: no NOTIFY; %d of %d folders watched with IDLE "
                "(intake.watch_connections_per_account), the rest read at the scheduler's passes",
                self.login.username,
                len(watched),
                len(self.folders),
            )
        tasks = [asyncio.create_task(self._idle_folder(watched[0], first))]
        tasks += [asyncio.create_task(self._idle_folder_own(folder)) for folder in watched[1:]]
        try:
            # The first connection's folder ends the wait when it fails: the run loop reopens.
            await tasks[0]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _idle_folder_own(self, folder: str) -> None:
        """IDLE on ``folder`` on a connection of its own, opened again after failures."""
        failures = 0
        while True:
            holder = f"watch-{uuid.uuid4().hex}"
            connection: WatchConnection | None = None
            try:
                connection = await self._open(holder)
                if connection is None:
                    await asyncio.sleep(self.intake.watch_lease_s)
                    continue
                failures = 0
                await self._idle_folder(folder, connection)
            except (AppError, RedisError) as exc:
                delay = self._backoff(failures, exc)
                failures += 1
                logger.warning("IMAP IDLE of %r failed: %s; again in %.0f s", folder, exc, delay)
                await asyncio.sleep(delay)
            finally:
                if connection is not None:
                    await self._close(connection, holder)

    async def _idle_folder(self, folder: str, connection: WatchConnection) -> None:
        await connection.examine(folder)
        self.watching.add(folder)
        try:
            await self.announce([folder], True)  # what came while nobody watched
            while True:
                if _is_new_mail(await connection.idle(self.intake_idle_s)):
                    await self.announce([folder], False)
        finally:
            self.watching.discard(folder)


def _is_new_mail(news: list[FolderNews]) -> bool:
    """Any EXISTS (the count changed: a poll that finds nothing new costs little), or a
    RECENT above 0."""
    return any(not item.recent or bool(item.count) for item in news)
