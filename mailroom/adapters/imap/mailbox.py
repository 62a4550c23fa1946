"""The ``Mailbox`` port intake reads: one IMAP folder connection, and what it fetches."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

from mailroom.settings import MailboxSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long ``close()`` waits for a call still running in its thread, in seconds.
CLOSE_WAIT_S = 5.0


@dataclass(frozen=True)
class FetchedMail:
    """One message as fetched: its UID, raw RFC 822 bytes and INTERNALDATE.

    A mail too big to read comes with ``headers_only``: ``raw`` is then its header
    block alone and ``size`` its RFC822.SIZE, and its body was never fetched.
    """

    uid: int
    raw: bytes
    internal_date: datetime | None
    headers_only: bool = False
    #: RFC822.SIZE, in bytes, when the server told it (a headers-only fetch).
    size: int | None = None


class Mailbox(Protocol):
    """What intake needs from one IMAP folder connection."""

    async def connect(self) -> None: ...

    async def check_health(self) -> None: ...

    async def select(self, folder: str) -> int:
        """Select ``folder`` and return its UIDVALIDITY."""
        ...

    async def uids_above(self, uid: int) -> list[int]:
        """Every UID greater than ``uid``, ascending."""
        ...

    async def larger_than(self, uids: list[int], size: int) -> set[int]:
        """Those of ``uids`` whose RFC822.SIZE is over ``size`` (lets fetches be bounded in bytes)."""
        ...

    async def fetch(self, uids: list[int]) -> list[FetchedMail]:
        """The messages of ``uids`` that still exist, in UID order."""
        ...

    async def fetch_headers(self, uids: list[int]) -> list[FetchedMail]:
        """Header blocks and sizes of the ``uids`` that still exist, bodies unread, in UID order."""
        ...

    async def add_flags(self, uids: list[int], flag: str) -> None:
        """Set ``flag`` on the messages of ``uids``; those no longer there are left out."""
        ...

    async def move(self, uids: list[int], folder: str) -> None:
        """Move the messages of ``uids`` to ``folder``; those no longer there are left out."""
        ...

    async def close(self) -> None:
        """Log out; never raises (a failure is logged)."""
        ...


MailboxFactory = Callable[[MailboxSettings], Mailbox]


def filter_uids_above(uids: list[int], uid: int) -> list[int]:
    """UIDs strictly above ``uid``, ascending.

    ``UID SEARCH N:*`` always matches the highest message, even when its UID is
    below N (RFC 3501: ``*`` is the largest UID in use), so results are filtered.
    """
    return sorted(u for u in set(uids) if u > uid)
