"""Seeding: the environment's mailboxes, accounts and routes copied into the table at start.

Rule: a row the seed wrote (``source = settings``) follows the environment (updated
when the environment's entry changes); a row an operator added, enabled or disabled
(``source = operator``) is never overwritten. An entry with a secret is skipped
while no ``runtime_config.key`` is set: it is still used, from the environment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.config_store import rows, secrets
from mailroom.config_store.effective import env_route_name
from mailroom.config_store.secrets import Cipher
from mailroom.db.audit import SYSTEM, add_audit_event
from mailroom.db.engine import transaction
from mailroom.errors import RuntimeConfigInvalid
from mailroom.process.identity import host_pid
from mailroom.settings import Settings

logger = logging.getLogger(__name__)

#: The warning for an environment entry left out of the table (its reason follows).
NOT_SEEDED = "Not seeded (still used from the environment): %s"


@dataclass
class SeedResult:
    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def entries(settings: Settings) -> list[tuple[str, str, BaseModel]]:
    """``(kind, name, model)`` of every environment entry."""
    delivery = settings.delivery
    found: list[tuple[str, str, BaseModel]] = [
        ("mailbox", mailbox.name, mailbox) for mailbox in settings.intake.mailboxes
    ]
    found += [("account", f"webhook:{n}", a) for n, a in delivery.webhook_accounts.items()]
    found += [("account", f"email:{n}", a) for n, a in delivery.email_accounts.items()]
    found += [("route", env_route_name(i), r) for i, r in enumerate(delivery.routes)]
    return found


async def seed(sessions: async_sessionmaker[AsyncSession], settings: Settings) -> SeedResult:
    """Upsert the environment's entries by the rule above, in one transaction."""
    cipher = Cipher(settings.runtime_config.key.get_secret_value())
    result = SeedResult()
    async with transaction(sessions) as session:
        for kind, name, model in entries(settings):
            try:
                config = secrets.dump(model, cipher, where=f"{kind} {name!r}")
            except RuntimeConfigInvalid as exc:
                logger.warning(NOT_SEEDED, exc)
                result.skipped.append(f"{kind} {name}")
                continue
            if await rows.seed_row(session, kind=kind, name=name, config=config, actor=host_pid()):
                result.written.append(f"{kind} {name}")
        if result.written:
            add_audit_event(
                session,
                actor_type=SYSTEM,
                actor_id=host_pid(),
                action="runtime_config.seed",
                target="runtime_config",
                detail={"written": result.written},
            )
    return result
