"""What each reader uses: the environment's entries overlaid by the table's rows.

An operator's row (``source = operator``) wins over the environment entry of the
same name; a disabled one turns its entry off. Seeded rows are copies the readers
skip: the environment is read itself. A row that cannot be read (bad secret,
refused config) is logged and, for accounts, kept as the reason its messages fail.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from mailroom.config_store import kinds, rows
from mailroom.config_store.secrets import Cipher
from mailroom.db.models import RuntimeConfig
from mailroom.errors import RuntimeConfigInvalid
from mailroom.settings import (
    DeliverySettings,
    EmailAccount,
    IntakeSettings,
    MailboxSettings,
    NotificationRoute,
    WebhookAccount,
)

logger = logging.getLogger(__name__)

Db = AsyncSession | AsyncConnection
Sessions = async_sessionmaker[AsyncSession]
S = TypeVar("S", IntakeSettings, DeliverySettings)


def env_route_name(index: int) -> str:
    """The row name of the environment's route number ``index`` (0-based)."""
    return f"settings-{index + 1}"


async def mailboxes(db: Db, intake: IntakeSettings, cipher: Cipher) -> list[MailboxSettings]:
    """Every mailbox, enabled or not (a disabled one is polled as ``disabled``)."""
    found = {mailbox.name: mailbox for mailbox in intake.mailboxes}
    for row in _operator_rows(await rows.rows_of(db, "mailbox")):
        try:
            model = kinds.from_row("mailbox", row.name, row.config, cipher, delivery=_NO_DELIVERY)
        except RuntimeConfigInvalid as exc:
            logger.warning("Mailbox row %r is not used: %s", row.name, exc)
            found.pop(row.name, None)
            continue
        assert isinstance(model, MailboxSettings)
        found[row.name] = model.model_copy(update={"enabled": model.enabled and row.enabled})
    return list(found.values())


async def routes(db: Db, delivery: DeliverySettings, cipher: Cipher) -> list[NotificationRoute]:
    """The enabled routes: the environment's (named ``settings-N``) and the table's."""
    found: dict[str, NotificationRoute | None] = {
        env_route_name(index): route for index, route in enumerate(delivery.routes)
    }
    for row in _operator_rows(await rows.rows_of(db, "route")):
        try:
            model = kinds.from_row("route", row.name, row.config, cipher, delivery=delivery)
        except RuntimeConfigInvalid as exc:
            logger.warning("Route row %r is not used: %s", row.name, exc)
            found[row.name] = None
            continue
        assert isinstance(model, NotificationRoute)
        found[row.name] = model if row.enabled else None
    return [route for route in found.values() if route is not None]


def _operator_rows(found: list[RuntimeConfig]) -> list[RuntimeConfig]:
    """The rows an operator wrote (added, replaced, enabled or disabled): they take over.

    A seeded row is a copy of the environment for ``list`` and the commands: the
    environment itself is read, so its changes count at once, and an entry removed
    from it stops being used even though its copy stays until an operator acts on it.
    """
    return [row for row in found if row.source == "operator"]


@dataclass(frozen=True)
class Accounts:
    """The delivery settings with the table's accounts, and why unusable accounts are."""

    settings: DeliverySettings
    #: ``channel:account`` -> why its messages fail (disabled, broken row).
    unusable: dict[str, str] = field(default_factory=dict)
    #: ``channel:account`` of every row, for invalidating chains whose row changed.
    names: frozenset[str] = frozenset()


async def accounts(db: Db, delivery: DeliverySettings, cipher: Cipher) -> Accounts:
    webhook = dict(delivery.webhook_accounts)
    email = dict(delivery.email_accounts)
    unusable: dict[str, str] = {}
    names = set()
    for row in _operator_rows(await rows.rows_of(db, "account")):
        names.add(row.name)
        channel, _, account = row.name.partition(":")
        (webhook if channel == "webhook" else email).pop(account, None)
        if not row.enabled:
            unusable[row.name] = f"account {row.name!r} is disabled"
            continue
        try:
            model = kinds.from_row("account", row.name, row.config, cipher, delivery=delivery)
        except RuntimeConfigInvalid as exc:
            unusable[row.name] = f"account {row.name!r} is broken: {exc}"
            continue
        if isinstance(model, WebhookAccount):
            webhook[account] = model
        elif isinstance(model, EmailAccount):
            email[account] = model
    # model_copy skips validation: the rows were checked one by one above.
    updated = delivery.model_copy(update={"webhook_accounts": webhook, "email_accounts": email})
    return Accounts(settings=updated, unusable=unusable, names=frozenset(names))


#: Mailboxes need no delivery settings (only webhook accounts check the allow-list).
_NO_DELIVERY = DeliverySettings()


class RuntimeAccounts:
    """The channel accounts as of the table's last change: one version query per check."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], delivery: DeliverySettings, cipher: Cipher
    ) -> None:
        self.sessions = sessions
        self.delivery = delivery
        self.cipher = cipher
        self._seen: tuple[int, int] | None = None

    async def changed(self) -> Accounts | None:
        """The accounts when a row changed since the last call (the first call loads them)."""
        version = await rows.version_of(self.sessions, "account")
        if version == self._seen:
            return None
        # Read after the version: a write in between is simply loaded again next time.
        async with self.sessions() as session:
            snapshot = await accounts(session, self.delivery, self.cipher)
        self._seen = version
        return snapshot


async def intake_settings(
    sessions: async_sessionmaker[AsyncSession], intake: IntakeSettings, key: str
) -> IntakeSettings:
    """``intake`` with its mailboxes as the table says now."""
    async with sessions() as session:
        found = await mailboxes(session, intake, Cipher(key))
    return intake.model_copy(update={"mailboxes": found})


async def delivery_routes(
    sessions: async_sessionmaker[AsyncSession], delivery: DeliverySettings, key: str
) -> DeliverySettings:
    """``delivery`` with its routes as the table says now."""
    async with sessions() as session:
        found = await routes(session, delivery, Cipher(key))
    return delivery.model_copy(update={"routes": found})


class KeptByVersion(Generic[S]):
    """Settings with the rows of one kind applied, kept until those rows change.

    Readers need them on every pass or poll, but reading the rows and decrypting
    their secrets each time cost more than the pass itself; the ``(max(version),
    count)`` pair of the kind's rows changes on every write, one query to ask.
    Kept per process; a call with other settings, key or database loads anew.
    """

    def __init__(self, kind: str, load: Callable[[Sessions, S, str], Awaitable[S]]) -> None:
        #: The ``runtime_config`` kind whose rows the settings carry, and how they are applied.
        self.kind = kind
        self.load: Callable[[Sessions, S, str], Awaitable[S]] = load
        # Compared by identity and held here, so an id is never reused while it is compared.
        self._sessions: Sessions | None = None
        self._base: S | None = None
        self._seen: tuple[str, tuple[int, int]] | None = None
        self._settings: S | None = None

    async def get(self, sessions: Sessions, base: S, key: str) -> S:
        seen = (key, await rows.version_of(sessions, self.kind))
        same_source = self._sessions is sessions and self._base is base
        if self._settings is not None and same_source and self._seen == seen:
            return self._settings
        # Read after the version: a write in between is simply loaded again next time.
        self._settings = await self.load(sessions, base, key)
        self._sessions, self._base, self._seen = sessions, base, seen
        return self._settings


def runtime_routes() -> KeptByVersion[DeliverySettings]:
    """``delivery_routes`` kept until the route rows change (notification passes)."""
    return KeptByVersion("route", delivery_routes)


def runtime_mailboxes() -> KeptByVersion[IntakeSettings]:
    """``intake_settings`` kept until the mailbox rows change (every poll needs them)."""
    return KeptByVersion("mailbox", intake_settings)
