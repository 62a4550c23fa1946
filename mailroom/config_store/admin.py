"""Operator actions on runtime configuration rows, each audit-logged in its transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.config_store import kinds, rows, secrets
from mailroom.config_store.secrets import Cipher
from mailroom.db.audit import OPERATOR, add_audit_event
from mailroom.errors import RuntimeConfigInvalid
from mailroom.settings import NotificationRoute, Settings


@dataclass(frozen=True)
class RowView:
    """A row as an operator sees it: secrets masked, never decrypted."""

    kind: str
    name: str
    enabled: bool
    source: str
    version: int
    updated_by: str
    updated_at: Any
    config: dict[str, Any]


async def add(
    session: AsyncSession,
    settings: Settings,
    *,
    kind: str,
    name: str,
    config: dict[str, Any],
    operator: str,
    replace: bool = False,
) -> int:
    """Validate ``config`` with the settings model, encrypt its secrets, store it; its version."""
    model = kinds.validate(kind, name, config, delivery=settings.delivery)
    if isinstance(model, NotificationRoute):
        await _check_route_account(session, settings, name, model)
    cipher = Cipher(settings.runtime_config.key.get_secret_value())
    stored = secrets.dump(model, cipher, where=f"{kind} {name!r}")
    existing = await rows.get_row(session, kind, name)
    if existing is not None and not replace:
        raise RuntimeConfigInvalid(f"{kind} {name!r} exists already; add --replace to change it")
    await rows.put_row(
        session, kind=kind, name=name, config=stored, source="operator", actor=operator
    )
    add_audit_event(
        session,
        actor_type=OPERATOR,
        actor_id=operator,
        action=f"runtime_config.{'replace' if existing else 'add'}",
        target=f"{kind}:{name}",
        detail={"config": secrets.masked(stored)},
    )
    row = await rows.get_row(session, kind, name)
    assert row is not None
    await session.refresh(row)
    return row.version


async def _check_route_account(
    session: AsyncSession, settings: Settings, name: str, route: NotificationRoute
) -> None:
    """A route to a webhook or e-mail account that exists nowhere is refused, as at load."""
    if route.channel not in kinds.ACCOUNT_MODELS:
        return  # other channels take any account name
    delivery = settings.delivery
    in_env = route.account in (
        delivery.webhook_accounts if route.channel == "webhook" else delivery.email_accounts
    )
    row_name = f"{route.channel}:{route.account}"
    if not in_env and await rows.get_row(session, "account", row_name) is None:
        raise RuntimeConfigInvalid(
            f"route {name!r}: no {route.channel} account {route.account!r}; add it first "
            f"(mailroom accounts add {row_name} ...)"
        )


async def set_enabled(
    session: AsyncSession, *, kind: str, name: str, enabled: bool, operator: str
) -> None:
    if not await rows.set_enabled(session, kind=kind, name=name, enabled=enabled, actor=operator):
        raise RuntimeConfigInvalid(f"no {kind} {name!r} in the table ({kind}s list shows them)")
    add_audit_event(
        session,
        actor_type=OPERATOR,
        actor_id=operator,
        action=f"runtime_config.{'enable' if enabled else 'disable'}",
        target=f"{kind}:{name}",
    )


async def views(session: AsyncSession, kind: str) -> list[RowView]:
    return [_view(row) for row in await rows.rows_of(session, kind)]


async def view(session: AsyncSession, kind: str, name: str) -> RowView | None:
    row = await rows.get_row(session, kind, name)
    return None if row is None else _view(row)


def _view(row: Any) -> RowView:
    return RowView(
        kind=row.kind,
        name=row.name,
        enabled=row.enabled,
        source=row.source,
        version=row.version,
        updated_by=row.updated_by,
        updated_at=row.updated_at,
        config=secrets.masked(row.config),
    )


def summary(item: RowView) -> str:
    """One short line of what the row points at (no secret, no template text)."""
    config = item.config
    if item.kind == "mailbox":
        return (
            f"{config.get('username', '')}@{config.get('host', '')}/{config.get('folder', 'INBOX')}"
        )
    if item.kind == "route":
        return (
            f"{config.get('mailbox', '*')}/{config.get('document_type', '*')} -> "
            f"{config.get('channel', 'log')}:{config.get('account', 'default')} "
            f"{config.get('recipient', 'ops')}"
        )
    return str(config.get("url") or config.get("host") or "")
