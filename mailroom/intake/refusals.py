"""Refusals that need a person: a login, folder or certificate the server refuses every time.

A poll that fails this way is backed off like any failed batch; after
``intake.block_after_refusals`` of them in a row the mailbox is blocked with the
refusal's reason, so it shows under "needs an operator" and fires an alert instead of
backing off for ever (ARCHITECTURE.md, Intake).
"""

from __future__ import annotations

from mailroom.errors import (
    MailboxCertificateRejected,
    MailboxFolderMissing,
    MailboxLoginRejected,
    OAuthTokenRefused,
)
from mailroom.settings import MailboxSettings

LOGIN_REFUSED = "LOGIN_REFUSED"
FOLDER_MISSING = "FOLDER_MISSING"
TLS_UNVERIFIED = "TLS_UNVERIFIED"

#: The error each reason stands for, in the order they are looked for.
_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (MailboxLoginRejected, LOGIN_REFUSED),
    (OAuthTokenRefused, LOGIN_REFUSED),
    (MailboxFolderMissing, FOLDER_MISSING),
    (MailboxCertificateRejected, TLS_UNVERIFIED),
)

#: What the operator checks before unblocking, by reason.
TO_CHECK = {
    LOGIN_REFUSED: "check its password or OAuth grant and that the account may log in",
    FOLDER_MISSING: "check that the folder exists on the server (renamed, deleted?) "
    "or fix the mailbox's folder",
    TLS_UNVERIFIED: "check the server's certificate (expired, issued for another host?) "
    "or the mailbox's ca_file",
}


def refusal_reason(exc: BaseException) -> str | None:
    """The reason a person must act on ``exc`` (or an error it was raised from), if any."""
    for error in causes(exc):
        for kind, reason in _REASONS:
            if isinstance(error, kind):
                return reason
    return None


def blocked_message(mailbox: MailboxSettings, reason: str, refusals: int) -> str:
    """The one ERROR line of a mailbox blocked for ``reason``: which, whose, what to check."""
    return (
        f"Mailbox {mailbox.name} (user {mailbox.username!r} on {mailbox.host}:{mailbox.port}, "
        f"folder {mailbox.folder!r}) blocked: {reason} {refusals} polls in a row; "
        f"{TO_CHECK[reason]}, then `mailroom intake unblock {mailbox.name}`"
    )


def causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain
