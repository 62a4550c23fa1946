"""Settings models to stored JSON and back, with every ``SecretStr`` Fernet-encrypted.

A secret is stored as ``{"$fernet": "<token>"}`` in place of its value, so the rest of
the row stays readable in ``psql`` and the same pydantic model validates it on load.
A URL that carries credentials (a webhook's ``https://user:password@host/?token=…``) is
a secret too: it is stored as ``{"$fernet": "<token>", "shown": "<the URL masked>"}``,
so ``show``, ``list`` and the audit rows still say where it points.
"""

from __future__ import annotations

import re
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pydantic import BaseModel, SecretStr
from pydantic_core import to_jsonable_python

from mailroom.errors import RuntimeConfigInvalid
from mailroom.redaction import has_credentials, mask_urls

#: The key under which an encrypted secret sits in stored JSON.
FERNET = "$fernet"
#: What ``show`` prints in place of a secret.
MASK = "**********"
#: The key beside ``FERNET`` holding what ``show`` prints of an encrypted URL.
SHOWN = "shown"
#: The start of a URL: only such text is looked at for credentials.
_URL_START = re.compile(r"[a-z][a-z0-9+.-]*://", re.I)


class Cipher:
    """Fernet with one or more keys (comma-separated): the first encrypts, all decrypt."""

    def __init__(self, keys: str) -> None:
        parts = [part.strip() for part in keys.split(",") if part.strip()]
        self._fernet: MultiFernet | None = None
        if parts:
            try:
                self._fernet = MultiFernet([Fernet(part) for part in parts])
            except (ValueError, TypeError):
                raise RuntimeConfigInvalid(
                    "runtime_config.key is not a Fernet key (urlsafe base64 of 32 bytes; make one "
                    "with: python -c 'from cryptography.fernet import Fernet; "
                    "print(Fernet.generate_key().decode())')"
                ) from None

    def encrypt(self, value: str, *, where: str) -> str:
        if self._fernet is None:
            raise RuntimeConfigInvalid(
                f"{where} has a secret but runtime_config.key is not set "
                "(MAILROOM_RUNTIME_CONFIG__KEY, a Fernet key)"
            )
        return self._fernet.encrypt(value.encode()).decode("ascii")

    def decrypt(self, token: str, *, where: str) -> str:
        if self._fernet is None:
            raise RuntimeConfigInvalid(f"{where} has a secret but runtime_config.key is not set")
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode()
        except (InvalidToken, ValueError):
            raise RuntimeConfigInvalid(
                f"{where}: a stored secret does not decrypt with runtime_config.key "
                "(key changed or row edited)"
            ) from None


def dump(model: BaseModel, cipher: Cipher, *, where: str) -> dict[str, Any]:
    """The model's fields as JSON, secrets encrypted (fields left at their default omitted)."""
    raw = model.model_dump(exclude_defaults=True, round_trip=True)
    return _encrypt(raw, cipher, where)  # type: ignore[no-any-return]


def load(stored: dict[str, Any], cipher: Cipher, *, where: str) -> dict[str, Any]:
    """Stored JSON with its secrets decrypted, ready for ``Model.model_validate``."""
    return _decrypt(stored, cipher, where)  # type: ignore[no-any-return]


def masked(stored: dict[str, Any]) -> dict[str, Any]:
    """Stored JSON with every secret replaced by a mask (what ``show`` prints)."""
    return _mask(stored)  # type: ignore[no-any-return]


def _encrypt(value: Any, cipher: Cipher, where: str) -> Any:
    if isinstance(value, SecretStr):
        return {FERNET: cipher.encrypt(value.get_secret_value(), where=where)}
    if isinstance(value, dict):
        return {str(k): _encrypt(v, cipher, where) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encrypt(v, cipher, where) for v in value]
    if _is_url_with_credentials(value):
        return {FERNET: cipher.encrypt(value, where=where), SHOWN: mask_urls(value)}
    return to_jsonable_python(value)


def _is_url_with_credentials(value: Any) -> bool:
    return isinstance(value, str) and bool(_URL_START.match(value)) and has_credentials(value)


def _is_secret(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) in ({FERNET}, {FERNET, SHOWN})
        and isinstance(value[FERNET], str)
    )


def _decrypt(value: Any, cipher: Cipher, where: str) -> Any:
    if _is_secret(value):
        return cipher.decrypt(value[FERNET], where=where)
    if isinstance(value, dict):
        return {k: _decrypt(v, cipher, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_decrypt(v, cipher, where) for v in value]
    return value


def _mask(value: Any) -> Any:
    if _is_secret(value):
        return str(value.get(SHOWN, MASK))
    if _is_url_with_credentials(value):  # a row written before such URLs were encrypted
        return mask_urls(value)
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return value
