"""IMAP IDLE on an imapclient connection: wait for news, tell news from keepalives."""

from __future__ import annotations

import ssl
import time
from typing import Any

from imapclient import IMAPClient


def idle_until_news(client: IMAPClient, deadline: float) -> list[Any]:
    """The responses of an IDLE up to ``deadline`` (``time.monotonic()``), read until one is
    more than a keepalive.

    A server's keepalive (``* OK Still here``) is not news: Dovecot sends its first one at a
    moment of its own choosing (every ``imap_idle_notify_interval``, aligned per client), so
    ending the wait there ended many IDLEs seconds in, and mail that came after waited for
    the next scheduled poll.
    """
    responses: list[Any] = []
    while (remaining := deadline - time.monotonic()) > 0:
        received = client.idle_check(timeout=remaining)
        responses += received
        if not received or not all(is_keepalive(response) for response in received):
            break
    return responses


def is_keepalive(response: Any) -> bool:
    return isinstance(response, tuple) and len(response) > 0 and response[0] == b"OK"


def announces_mail(responses: list[Any]) -> bool:
    """Whether parsed untagged responses include an ``EXISTS`` (new mail, or a new count)."""
    return any(isinstance(r, tuple) and b"EXISTS" in r for r in responses)


def take_announced(client: IMAPClient) -> bool:
    """Whether a command's response announced a new message count since we last looked.

    imaplib keeps the untagged responses that no command asked for; imapclient never reads
    the EXISTS among them.
    """
    return bool(client._imap.untagged_responses.pop("EXISTS", None))


def buffered(client: IMAPClient) -> bool:
    """Whether imaplib's reader holds bytes the server sent that nobody has read yet."""
    sock = client.socket()
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        return bool(client._imap.file.peek(1))  # at most one read, which must not wait
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    finally:
        sock.settimeout(timeout)
