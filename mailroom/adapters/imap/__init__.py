"""IMAP: the ``Mailbox`` port intake reads and its imapclient client.

The in-memory fake for unit tests lives beside them in ``mailroom.adapters.imap.memory``.
"""

from mailroom.adapters.imap.client import SEEN, ImapMailbox
from mailroom.adapters.imap.mailbox import (
    CLOSE_WAIT_S,
    FetchedMail,
    Mailbox,
    MailboxFactory,
    filter_uids_above,
)

__all__ = [
    "CLOSE_WAIT_S",
    "SEEN",
    "FetchedMail",
    "ImapMailbox",
    "Mailbox",
    "MailboxFactory",
    "filter_uids_above",
]
