"""What each kind of row holds: the settings model that validates it, and its name rule.

* ``mailbox``: ``MailboxSettings``, named by its ``name``.
* ``account``: ``channel:account``, a ``WebhookAccount`` or an ``EmailAccount``.
* ``route``: ``NotificationRoute``, named by the operator.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from mailroom import outbound
from mailroom.config_store import secrets
from mailroom.config_store.secrets import Cipher
from mailroom.errors import RuntimeConfigInvalid, WebhookTargetRefused
from mailroom.settings import (
    DeliverySettings,
    EmailAccount,
    MailboxSettings,
    NotificationRoute,
    WebhookAccount,
)

KINDS = ("mailbox", "account", "route")
#: Channels whose accounts have a settings model (other channels take any account name).
ACCOUNT_MODELS: dict[str, type[BaseModel]] = {"webhook": WebhookAccount, "email": EmailAccount}


def model_for(kind: str, name: str) -> type[BaseModel]:
    if kind == "mailbox":
        return MailboxSettings
    if kind == "route":
        return NotificationRoute
    channel, _, account = name.partition(":")
    if not account or channel not in ACCOUNT_MODELS:
        raise RuntimeConfigInvalid(
            f"account {name!r}: name it channel:account with channel one of "
            f"{', '.join(ACCOUNT_MODELS)} (webhook:ops)"
        )
    return ACCOUNT_MODELS[channel]


def validate(
    kind: str, name: str, config: dict[str, Any], *, delivery: DeliverySettings
) -> BaseModel:
    """The row's model, checked as the settings would check it; one-line ``RuntimeConfigInvalid``."""
    where = f"{kind} {name!r}"
    if kind == "mailbox":
        config = {**config, "name": config.get("name", name)}
        if config["name"] != name:
            raise RuntimeConfigInvalid(f"{where}: config name {config['name']!r} differs")
    try:
        model = model_for(kind, name).model_validate(config)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(part) for part in first["loc"]) or "config"
        raise RuntimeConfigInvalid(f"{where}: {at}: {first['msg']}") from None
    if isinstance(model, WebhookAccount):
        try:
            outbound.check_url(model.url, delivery.webhook_allow_list)
        except WebhookTargetRefused as exc:
            raise RuntimeConfigInvalid(f"{where}: {exc}") from None
    return model


def from_row(
    kind: str, name: str, stored: dict[str, Any], cipher: Cipher, *, delivery: DeliverySettings
) -> BaseModel:
    """The model of a stored row; ``RuntimeConfigInvalid`` saying why when it is broken."""
    plain = secrets.load(stored, cipher, where=f"{kind} {name!r}")
    return validate(kind, name, plain, delivery=delivery)
