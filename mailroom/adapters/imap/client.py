"""IMAP: the ``Mailbox`` port met by imapclient.

imapclient is blocking, so every call runs in a thread: each connection has
its own one-thread executor, not the loop's default one: a slow FETCH would
otherwise hold a thread of the default executor (6 threads on 2 cores) and stall
the ``to_thread`` calls of SMTP, S3 and broker sends. One thread also keeps one
connection's calls in order. Nothing here waits for new mail: the watcher
(``mailroom.watch``) does, on asyncio. Vendor errors stop here and leave as
``MailboxUnavailable`` (retryable: the connection dropped or timed out),
``MailboxLoginRejected`` (permanent: bad credentials), ``MailboxFolderMissing``,
``MailboxCertificateRejected`` or ``MailboxCommandFailed`` (the server said NO or BAD).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import imaplib
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from imapclient import DELETED, IMAPClient
from imapclient.exceptions import LoginError

from mailroom.adapters import oauth
from mailroom.adapters.imap.mailbox import CLOSE_WAIT_S, FetchedMail, filter_uids_above
from mailroom.errors import (
    MailboxCertificateRejected,
    MailboxCommandFailed,
    MailboxFolderMissing,
    MailboxLoginRejected,
    MailboxUnavailable,
    RetryableError,
)
from mailroom.settings import MailboxSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")


#: The flag of a message that has been read (RFC 3501).
SEEN = "\\Seen"


#: Login refusals that say nothing of the credentials (RFC 5530 response codes): the server
#: is busy, or the user holds too many connections (Dovecot's mail_max_userip_connections).
TEMPORARY_LOGIN_CODES = ("[UNAVAILABLE]", "[LIMIT]", "[INUSE]", "[SERVERBUG]")

#: How servers say a SELECTed folder is not there: the RFC 5530 code (pymap), or Dovecot's
#: text, which comes without it.
MISSING_FOLDER_MARKS = ("[NONEXISTENT]", "doesn't exist", "does not exist", "no such mailbox")


@contextmanager
def _translate_errors(what: str) -> Iterator[None]:
    try:
        yield
    except LoginError as exc:
        if any(code in str(exc) for code in TEMPORARY_LOGIN_CODES):
            raise MailboxUnavailable(f"{what}: login refused for now: {_short(exc)}") from exc
        raise MailboxLoginRejected(f"{what}: {_short(exc)}") from exc
    except imaplib.IMAP4.abort as exc:
        raise MailboxUnavailable(f"{what}: {_short(exc)}") from exc
    except imaplib.IMAP4.error as exc:
        raise MailboxCommandFailed(f"{what}: {_short(exc)}") from exc
    except ssl.SSLCertVerificationError as exc:  # before OSError, which it is too
        raise MailboxCertificateRejected(f"{what}: {exc.verify_message or _short(exc)}") from exc
    except (OSError, EOFError) as exc:  # socket errors, timeouts, TLS failures
        raise MailboxUnavailable(f"{what}: {type(exc).__name__}: {_short(exc)}") from exc


def _short(exc: BaseException) -> str:
    return repr(str(exc)[:200])


class ImapMailbox:
    """One imapclient connection, each blocking call run in a thread."""

    def __init__(self, settings: MailboxSettings) -> None:
        self.settings = settings
        self._client: IMAPClient | None = None
        self._folder: str | None = None
        #: The folder's PERMANENTFLAGS from SELECT; None when it named none (all are kept).
        self._permanent_flags: list[str] | None = None
        #: UIDNEXT from the last SELECT, until the next command or ``uids_above`` uses it.
        self._uidnext: int | None = None
        # Guards ``_client`` and ``_closes`` between the event loop and a connecting thread:
        # a connect that completes after close() must end its own connection.
        self._lock = threading.Lock()
        self._closes = 0
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # The running (or last) call in our thread; close() waits for it to end.
        self._running: concurrent.futures.Future[Any] | None = None

    def _thread(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:  # created anew after close(), for a reconnect
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"imap-{self.settings.name}"
            )
        return self._executor

    async def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        # Like ``asyncio.to_thread``: the call sees our context (log fields), and a
        # cancelled await leaves the thread running until the call returns.
        self._uidnext = None  # it holds only until the next command
        context = contextvars.copy_context()
        running = self._thread().submit(context.run, fn, *args)
        self._running = running
        with _translate_errors(what):
            return await asyncio.wrap_future(running)

    def _require(self) -> IMAPClient:
        if self._client is None:
            raise MailboxUnavailable("not connected")
        return self._client

    def _ssl_context(self) -> ssl.SSLContext:
        cafile = str(self.settings.ca_file) if self.settings.ca_file else None
        return ssl.create_default_context(cafile=cafile)

    def _connect(self) -> IMAPClient:
        s = self.settings
        closes = self._closes
        context = self._ssl_context() if s.security != "plain" else None
        client = IMAPClient(
            s.host,
            port=s.port,
            ssl=s.security == "ssl",
            ssl_context=context,
            timeout=s.timeout_s,
        )
        with self._lock:
            if self._closes != closes:  # close() ran while we connected: nobody else will end it
                _shutdown_quietly(client)
                raise MailboxUnavailable("connection closed while connecting")
            # Keep the connection even if STARTTLS or LOGIN fails, so close() can end it.
            self._client = client
        _no_delay(client)
        client.normalise_times = False  # aware datetimes, not local naive ones
        if s.security == "starttls":
            client.starttls(context)
        _login(client, s)
        return client

    async def connect(self) -> None:
        await self._call(f"connect {self.settings.name}", self._connect)

    async def check_health(self) -> None:
        await self._call("NOOP", self._require().noop)

    async def select(self, folder: str) -> int:
        self._folder = folder
        try:
            info = await self._call(f"SELECT {folder!r}", _select, self._require(), folder)
        except MailboxCommandFailed as exc:
            if any(mark.lower() in str(exc).lower() for mark in MISSING_FOLDER_MARKS):
                raise MailboxFolderMissing(str(exc)) from exc
            raise
        permanent = info.get(b"PERMANENTFLAGS")
        self._permanent_flags = None if permanent is None else [_text(f) for f in permanent]
        uidnext = info.get(b"UIDNEXT")
        self._uidnext = uidnext if isinstance(uidnext, int) else None
        try:
            return int(info[b"UIDVALIDITY"])
        except (KeyError, TypeError, ValueError) as exc:
            raise MailboxCommandFailed(f"SELECT {folder!r}: no UIDVALIDITY") from exc

    async def uids_above(self, uid: int) -> list[int]:
        uidnext, self._uidnext = self._uidnext, None
        if uidnext is not None and uidnext <= uid + 1:
            # Every UID in the folder is below the SELECT's UIDNEXT (RFC 3501): nothing new, and
            # an empty poll needs no SEARCH. Only a call right after the SELECT trusts it; mail
            # that lands later is found by the next poll's SEARCH.
            return []
        found = await self._call("UID SEARCH", self._require().search, ["UID", f"{uid + 1}:*"])
        return filter_uids_above([int(u) for u in found], uid)

    async def larger_than(self, uids: list[int], size: int) -> set[int]:
        if not uids:
            return set()
        # SEARCH, not FETCH RFC822.SIZE: one short command, and servers answer it from metadata.
        criteria = ["UID", f"{min(uids)}:{max(uids)}", "LARGER", str(size)]
        found = await self._call("UID SEARCH LARGER", self._require().search, criteria)
        return {int(u) for u in found} & set(uids)

    async def fetch(self, uids: list[int]) -> list[FetchedMail]:
        if not uids:
            return []
        # BODY.PEEK[]: the whole mail, like RFC822, without setting \Seen on a mailbox that
        # people may read too. The answer comes back as BODY[].
        data = await self._call(
            "UID FETCH", _fetch_quietly, self._require(), uids, ["BODY.PEEK[]", "INTERNALDATE"]
        )
        mails = []
        for uid in sorted(data):
            item = data[uid]
            raw = item.get(b"BODY[]")
            if raw is None:  # expunged between SEARCH and FETCH
                continue
            mails.append(FetchedMail(int(uid), bytes(raw), _aware(item.get(b"INTERNALDATE"))))
        return mails

    async def fetch_headers(self, uids: list[int]) -> list[FetchedMail]:
        if not uids:
            return []
        # Only the header block and the size: the body of a mail over the limit is never read.
        data = await self._call(
            "UID FETCH HEADER",
            _fetch_quietly,
            self._require(),
            uids,
            ["RFC822.SIZE", "BODY.PEEK[HEADER]", "INTERNALDATE"],
        )
        mails = []
        for uid in sorted(data):
            item = data[uid]
            header = item.get(b"BODY[HEADER]")
            if header is None:  # expunged between SEARCH and FETCH
                continue
            size = item.get(b"RFC822.SIZE")
            mails.append(
                FetchedMail(
                    int(uid),
                    bytes(header),
                    _aware(item.get(b"INTERNALDATE")),
                    headers_only=True,
                    size=int(size) if size is not None else None,
                )
            )
        return mails

    async def add_flags(self, uids: list[int], flag: str) -> None:
        if not uids:
            return
        kept = self._permanent_flags
        if kept is not None and not _keeps(kept, flag):
            # The server would answer OK and keep the flag only for this session (pymap keeps
            # no keywords): say so rather than claim a flag nobody will see.
            raise MailboxCommandFailed(
                f"UID STORE +FLAGS {flag}: the server keeps only {' '.join(kept)} "
                f"in {self._folder!r}"
            )
        await self._call(f"UID STORE +FLAGS {flag}", _add_flags, self._require(), uids, flag)

    async def move(self, uids: list[int], folder: str) -> None:
        if uids:
            await self._call(f"UID MOVE to {folder!r}", _move, self._require(), uids, folder)

    async def close(self) -> None:
        with self._lock:
            self._closes += 1
            client, self._client = self._client, None
        executor, self._executor = self._executor, None
        try:
            await self._close(client, executor)
        finally:
            if executor is not None:
                # Its thread ends after the call it runs (a connect ends its own connection).
                executor.shutdown(wait=False)

    async def _close(
        self, client: IMAPClient | None, executor: concurrent.futures.ThreadPoolExecutor | None
    ) -> None:
        running = self._running
        if running is not None and not running.done():
            # A call was cancelled while its thread still runs (a slow FETCH, a connect):
            # closing the socket wakes it, and we wait so the thread ends before us. A connect
            # still running sees ``_closes`` move and ends the connection it opens itself.
            # Shutting a socket down does not block: it needs no thread of its own.
            if client is not None:
                _shutdown_quietly(client)
            waiter = asyncio.wrap_future(running)
            done, _ = await asyncio.wait([waiter], timeout=CLOSE_WAIT_S)
            if not done:
                waiter.cancel()  # no callback into this loop once the thread ends
            elif not waiter.cancelled():
                waiter.exception()  # the woken call fails (closed socket): expected, not logged
            return
        if client is None or executor is None:
            return
        try:
            with _translate_errors("LOGOUT"):
                await asyncio.wrap_future(executor.submit(client.logout))
        except RetryableError as exc:
            logger.warning("IMAP logout of %s failed: %s", self.settings.name, exc)
            _shutdown_quietly(client)


def _login(client: IMAPClient, settings: MailboxSettings) -> None:
    """LOGIN with the password, or AUTHENTICATE with an OAuth token (``settings.auth``).

    A refused token is dropped from the cache, so the next connect fetches a new one.
    """
    if settings.auth == "password" or settings.oauth is None:
        client.login(settings.username, settings.password.get_secret_value())
        return
    token = oauth.TOKENS.token(settings.oauth)
    try:
        if settings.auth == "oauthbearer":
            client.oauthbearer_login(settings.username, token)
        else:
            client.oauth2_login(settings.username, token)
    except LoginError as exc:
        oauth.TOKENS.invalidate(settings.oauth, token)
        raise LoginError(f"{settings.auth.upper()} token refused: {exc}") from exc


def _no_delay(client: IMAPClient) -> None:
    """Send each command at once (TCP_NODELAY).

    imapclient writes a SEARCH in two pieces, the command and then its CRLF; with Nagle's
    algorithm the second waits for the server to acknowledge the first, which a server
    delays by up to 40 ms (delayed ACK): every SEARCH took about 45 ms against pymap
    where it needs 2. The option lives on the socket, so it holds under TLS and STARTTLS.
    """
    try:
        client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:  # not a TCP socket (a test double), or already closed
        logger.debug("IMAP TCP_NODELAY not set: %r", exc)


def _shutdown_quietly(client: IMAPClient) -> None:
    try:
        client.shutdown()
    except (OSError, imaplib.IMAP4.error) as exc:
        logger.debug("IMAP socket shutdown failed: %r", exc)


def _text(flag: object) -> str:
    return flag.decode() if isinstance(flag, bytes) else str(flag)


def _keeps(permanent: list[str], flag: str) -> bool:
    """Whether a folder whose PERMANENTFLAGS are ``permanent`` keeps ``flag`` (RFC 3501 7.1).

    Flags compare without case; ``\\*`` lets any keyword be created, not a system flag.
    """
    kept = {f.lower() for f in permanent}
    return flag.lower() in kept or (not flag.startswith("\\") and "\\*" in kept)


def _fetch_quietly(client: IMAPClient, uids: list[int], items: list[str]) -> dict[int, Any]:
    """``client.fetch`` with imaplib's protocol log off.

    imapclient sets imaplib's debug level to 5, and imaplib then formats the repr of each
    literal it reads into a log message whether or not anything logs it: for a 40 MB mail,
    80 MiB more at the peak and the CPU to fill them.
    """
    imap = client._imap
    level, imap.debug = imap.debug, 0
    try:
        fetched: dict[int, Any] = client.fetch(uids, items)  # imapclient is unannotated
        return fetched
    finally:
        imap.debug = level


def _add_flags(client: IMAPClient, uids: list[int], flag: str) -> None:
    # Silent: no FETCH answer per message. UIDs that are gone match nothing, which is no error.
    client.add_flags(uids, [flag], silent=True)


def _move(client: IMAPClient, uids: list[int], folder: str) -> None:
    """UID MOVE (RFC 6851), or COPY, STORE \\Deleted and EXPUNGE where the server lacks it.

    The fallback expunges only ``uids`` with UIDPLUS (UID EXPUNGE); without it a plain EXPUNGE
    also removes mail someone else marked deleted in the folder. UIDs already moved away match
    nothing and move nothing.
    """
    if client.has_capability("MOVE"):
        client.move(uids, folder)
    else:
        client.copy(uids, folder)
        client.add_flags(uids, [DELETED], silent=True)
        if client.has_capability("UIDPLUS"):
            client.uid_expunge(uids)
        else:
            client.expunge()
    # The EXPUNGE responses that announced the moved mails: kept by imaplib, read by nobody.
    client._imap.untagged_responses.pop("EXPUNGE", None)


def _select(client: IMAPClient, folder: str) -> dict[bytes, Any]:
    info: dict[bytes, Any] = client.select_folder(folder)
    # The SELECT's own EXISTS is in ``info``: any that imaplib keeps from here on is news.
    client._imap.untagged_responses.pop("EXISTS", None)
    return info


def _aware(value: object) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
