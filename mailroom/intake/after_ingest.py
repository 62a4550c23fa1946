"""The after-ingest action: what intake does on the server to mail it has stored.

A mailbox's ``after_ingest`` is ``none`` (the default: fetching with BODY.PEEK[]
leaves the mail unread where it was), ``seen``, ``flag`` or ``move``. It runs
for a group of mails after their transactions committed, as one IMAP command on
their UIDs. The cursor is past those UIDs already, so a failed action is logged
and loses only the action: the mail stays stored once and is not read again.
Each action is idempotent: a flag set twice is set, and a mail moved away
matches nothing the second time.
"""

from __future__ import annotations

import logging

from mailroom.adapters.imap import SEEN, Mailbox
from mailroom.errors import AppError
from mailroom.settings import MailboxSettings

logger = logging.getLogger(__name__)


async def apply_after_ingest(
    mailbox: MailboxSettings, connection: Mailbox, uids: list[int]
) -> None:
    """Run ``mailbox.after_ingest`` on ``uids`` (committed mails); never raises but to cancel."""
    action = mailbox.after_ingest
    if action == "none" or not uids:
        return
    try:
        if action == "seen":
            await connection.add_flags(uids, SEEN)
        elif action == "flag":
            await connection.add_flags(uids, mailbox.after_ingest_flag)
        elif mailbox.move_to:  # a ``move`` without it fails at load
            await connection.move(uids, mailbox.move_to)
    except AppError as exc:
        logger.warning(
            "Mailbox %s: after-ingest %s of UID(s) %s failed; the mail stays stored: %s",
            mailbox.name,
            action,
            uid_ranges(uids),
            exc,
        )
    except Exception:  # an unknown error is logged whole; the mail is stored all the same
        logger.warning(
            "Mailbox %s: after-ingest %s of UID(s) %s failed; the mail stays stored",
            mailbox.name,
            action,
            uid_ranges(uids),
            exc_info=True,
        )


def uid_ranges(uids: list[int]) -> str:
    """``uids`` as an IMAP sequence set, runs joined: ``101:104,107``."""
    ordered = sorted(set(uids))
    runs: list[str] = []
    start = previous = ordered[0] if ordered else 0
    for uid in ordered[1:]:
        if uid != previous + 1:
            runs.append(f"{start}:{previous}" if start != previous else str(start))
            start = uid
        previous = uid
    if ordered:
        runs.append(f"{start}:{previous}" if start != previous else str(start))
    return ",".join(runs)
