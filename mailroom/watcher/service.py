"""The watcher process's loop: lease accounts, keep their watches running, send the polls.

Every third of ``intake.watch_lease_s`` it reads the enabled mailboxes with ``idle`` on
(the environment's and the table's, as polls do), groups them by account
(``connections.account_key``), renews and rebalances its account leases
(``leases.AccountLeases``) and starts or stops the account watches to match. News from
a watch goes through one queue: what gathered while the last send ran is marked in one
statement (``pending.mark_polls_queued``, leased cursors too: see ``poll_again``) and
sent, one ``poll_mailbox`` per mailbox, by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.config_store import effective
from mailroom.errors import AppError
from mailroom.intake.account_slots import AccountSlots, SlotKeeper
from mailroom.intake.connections import account_key
from mailroom.intake.pending import mark_polls_queued, mark_watched
from mailroom.process.identity import host_pid
from mailroom.settings import IntakeSettings, MailboxSettings, Settings
from mailroom.watcher.account import AccountWatch
from mailroom.watcher.leases import AccountLeases

logger = logging.getLogger(__name__)

#: Redis calls of the watches at once: each holds a connection of the client's pool.
REDIS_IN_FLIGHT = 8

#: Errors of a round or a send that the next one may not meet (Redis, Postgres, the broker).
ROUND_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    AppError,
    aioredis.RedisError,
    SQLAlchemyError,
)


@dataclass(frozen=True)
class Account:
    """The watched mailboxes of one account: a login and the mailbox names per folder."""

    login: MailboxSettings
    names: dict[str, list[str]]

    @property
    def folders(self) -> list[str]:
        return sorted(self.names)


def watched_accounts(intake: IntakeSettings) -> dict[str, Account]:
    """The enabled mailboxes with ``idle`` on, by account."""
    accounts: dict[str, Account] = {}
    for mailbox in intake.mailboxes:
        if not (mailbox.enabled and mailbox.idle):
            continue
        key = account_key(mailbox)
        account = accounts.setdefault(key, Account(mailbox, {}))
        account.names.setdefault(mailbox.folder, []).append(mailbox.name)
    return accounts


class Watcher:
    """Watches its share of the accounts until ``stop`` is set."""

    def __init__(
        self,
        *,
        settings: Settings,
        sessions: async_sessionmaker[AsyncSession],
        redis: aioredis.Redis,
        send: Callable[[str], object],
        stop: asyncio.Event | None = None,
        holder: str | None = None,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.send = send
        self.stop = stop or asyncio.Event()
        intake = settings.intake
        namespace = settings.broker.namespace
        self.leases = AccountLeases(
            redis, namespace=namespace, holder=holder or host_pid(), lease_s=intake.watch_lease_s
        )
        self.slots = AccountSlots(
            redis,
            namespace=namespace,
            limit=intake.max_connections_per_account,
            ttl_s=intake.watch_lease_s,
            max_in_flight=REDIS_IN_FLIGHT,
        )
        self.keeper = SlotKeeper(self.slots)
        self.watches: dict[str, tuple[AccountWatch, asyncio.Task[None]]] = {}
        self.sent = 0
        self._accounts: dict[str, Account] = {}
        self._intake = intake
        self._mailboxes = effective.runtime_mailboxes()
        #: (mailbox, catch_up): a (re)connect's announcements send even past a queued mark.
        self._news: asyncio.Queue[tuple[str, bool]] = asyncio.Queue()

    @property
    def connections(self) -> int:
        """IMAP connections this watcher holds open now."""
        return sum(watch.connections for watch, _ in self.watches.values())

    async def run(self) -> None:
        logger.info("IMAP watcher %s started", self.leases.holder)
        sender = asyncio.create_task(self._send_news())
        try:
            while not self.stop.is_set():
                try:
                    await self._round()
                except ROUND_ERRORS as exc:
                    logger.warning("IMAP watcher: round failed: %s: %s", type(exc).__name__, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self._intake.watch_lease_s / 3)
        finally:
            sender.cancel()
            watched = self._watched_pairs()
            await self._stop_watches(list(self.watches))
            await self.keeper.aclose()
            with contextlib.suppress(*ROUND_ERRORS):  # else they run out within a lease
                await mark_watched(self.sessions, watched, for_s=None)
            with contextlib.suppress(*ROUND_ERRORS):
                await self.leases.release_all()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            logger.info("IMAP watcher %s stopped (%d polls sent)", self.leases.holder, self.sent)

    async def _round(self) -> None:
        key = self.settings.runtime_config.key.get_secret_value()
        self._intake = await self._mailboxes.get(self.sessions, self.settings.intake, key)
        accounts = watched_accounts(self._intake)
        held = await self.leases.rebalance(sorted(accounts))
        changed = [
            account
            for account, (watch, task) in self.watches.items()
            if account not in held
            or watch.folders != accounts[account].folders
            or watch.login != accounts[account].login
            or task.done()
        ]
        for account in changed:
            _, task = self.watches[account]
            if task.done() and not task.cancelled() and task.exception() is not None:
                logger.error("IMAP watch of an account ended", exc_info=task.exception())
        await self._stop_watches(changed)
        self._accounts = {key: accounts[key] for key in held}
        for account in held - set(self.watches):
            self._start_watch(account, accounts[account])
        # The folders watched live now: the scheduler's pass polls them only now and then.
        await mark_watched(self.sessions, self._watched_pairs(), for_s=self._intake.watch_lease_s)

    def _watched_pairs(self) -> list[tuple[str, str]]:
        pairs = []
        for key, (watch, _) in self.watches.items():
            names = self._accounts[key].names if key in self._accounts else {}
            pairs += [(name, folder) for folder in watch.watching for name in names.get(folder, [])]
        return pairs

    def _start_watch(self, key: str, account: Account) -> None:
        async def announce(folders: list[str], catch_up: bool) -> None:
            for folder in folders:
                for name in account.names.get(folder, []):
                    self._news.put_nowait((name, catch_up))

        watch = AccountWatch(
            key,
            account.login,
            account.folders,
            intake=self._intake,
            keeper=self.keeper,
            announce=announce,
        )
        self.watches[key] = (watch, asyncio.create_task(watch.run(), name=f"watch-{key[:8]}"))

    async def _stop_watches(self, keys: list[str]) -> None:
        tasks = [self.watches.pop(key)[1] for key in keys if key in self.watches]
        for task in tasks:
            task.cancel()
        # Each closes its connections (LOGOUT waits a second at most), all at once.
        await asyncio.gather(*tasks, return_exceptions=True)

    def _folders_of(self) -> dict[str, str]:
        return {
            name: folder
            for account in self._accounts.values()
            for folder, names in account.names.items()
            for name in names
        }

    def _send_all(self, names: list[str]) -> None:
        # The broker's send blocks: it runs on a thread, off the connections' loop.
        for name in names:
            self.send(name)

    async def _send_news(self) -> None:
        """Mark and send a poll for each mailbox with news, those gathered meanwhile together."""
        while True:
            news = {await self._news.get()}
            while not self._news.empty():
                news.add(self._news.get_nowait())
            folders = self._folders_of()
            try:
                due: list[str] = []
                for catch_up in (False, True):
                    names = sorted({name for name, c in news if c is catch_up and name in folders})
                    pairs = [(name, folders[name]) for name in names]
                    # A catch-up takes a queued mark for lost: its poll may never have been sent.
                    lost_after_s = 0.0 if catch_up else self._intake.poll_lost_after_s
                    marked = await mark_polls_queued(
                        self.sessions, pairs, lost_after_s=lost_after_s, leased_too=True
                    )
                    due += [name for name in names if name in marked and name not in due]
                await asyncio.to_thread(self._send_all, due)
            except ROUND_ERRORS as exc:  # the scheduler's next pass reads these mailboxes
                logger.warning("IMAP watcher: polls not sent: %s: %s", type(exc).__name__, exc)
                continue
            except Exception:  # a bug: logged (and reported), and the next news is sent
                logger.exception("IMAP watcher: polls not sent")
                continue
            self.sent += len(due)
            logger.debug("IMAP watcher: polls sent for %s", ", ".join(due))
