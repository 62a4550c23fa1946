"""IMAP on asyncio for watching: the few commands that wait for new mail, on many connections.

The watcher holds one connection per account (NOTIFY, RFC 5465) or per folder (IDLE,
RFC 2177) for as long as it runs, so it cannot spend a thread on each as the polls'
imapclient does. No asyncio library fits: aioimaplib has no NOTIFY and keeps no
unsolicited responses outside IDLE, and the watcher needs only LOGIN or AUTHENTICATE,
STARTTLS, EXAMINE, NOTIFY, IDLE, NOOP and LOGOUT. Responses are read whole, literals
included; only the untagged ones that announce mail are looked at. Vendor errors stop
here and leave as the intake adapter's do (``client.py``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from imapclient import imap_utf7

from mailroom.adapters import oauth
from mailroom.adapters.imap.client import MISSING_FOLDER_MARKS, TEMPORARY_LOGIN_CODES
from mailroom.errors import (
    MailboxCertificateRejected,
    MailboxCommandFailed,
    MailboxFolderMissing,
    MailboxLoginRejected,
    MailboxUnavailable,
)
from mailroom.settings import MailboxSettings

logger = logging.getLogger(__name__)

_LITERAL = re.compile(rb"\{(\d+)\+?\}\r\n$")
_TAGGED = re.compile(rb"^(W\d+) (OK|NO|BAD)\b ?(.*)", re.DOTALL)
_EXISTS = re.compile(rb"^\* (\d+) (EXISTS|RECENT)\r\n$", re.IGNORECASE)
_STATUS = re.compile(rb"^\* STATUS (.+) \((.*)\)\r\n$", re.IGNORECASE | re.DOTALL)
_UIDNEXT = re.compile(rb"UIDNEXT (\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class FolderNews:
    """An untagged response that may announce mail: a folder's UIDNEXT (NOTIFY's STATUS) or
    a selected folder's message count (IDLE's EXISTS or RECENT)."""

    folder: str | None
    uidnext: int | None = None
    count: int | None = None
    recent: bool = False


@contextmanager
def _translate_errors(what: str) -> Iterator[None]:
    try:
        yield
    except ssl.SSLCertVerificationError as exc:
        raise MailboxCertificateRejected(f"{what}: {exc.verify_message or exc}") from exc
    except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise MailboxUnavailable(f"{what}: {type(exc).__name__}: {str(exc)[:200]!r}") from exc


def encode_folder(folder: str) -> bytes:
    """A folder name as a quoted IMAP string, in modified UTF-7 (RFC 3501 5.1.3)."""
    raw: bytes = imap_utf7.encode(folder)
    return b'"' + raw.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'


def decode_folder(text: bytes) -> str:
    """The folder name of a STATUS response: quoted, an atom, or a literal."""
    text = text.strip()
    if text.startswith(b'"') and text.endswith(b'"'):
        text = re.sub(rb"\\(.)", rb"\1", text[1:-1])
    elif (match := re.match(rb"^\{\d+\+?\}\r\n", text)) is not None:
        text = text[match.end() :]
    return str(imap_utf7.decode(text))


def _quoted(value: str) -> bytes:
    raw = value.encode()
    return b'"' + raw.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'


class WatchConnection:
    """One logged-in IMAP connection of an account, on the event loop."""

    def __init__(self, settings: MailboxSettings) -> None:
        self.settings = settings
        self.capabilities: set[str] = set()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tags = 0
        self._notified: list[str] = []
        #: Times NOTIFY was set anew because a NOOP found news the server had not sent.
        self.renewals = 0

    @property
    def offers_notify(self) -> bool:
        return "NOTIFY" in self.capabilities

    def _ssl_context(self) -> ssl.SSLContext:
        cafile = str(self.settings.ca_file) if self.settings.ca_file else None
        return ssl.create_default_context(cafile=cafile)

    async def open(self) -> None:
        """Connect, greet, STARTTLS where set, log in; learn the capabilities."""
        s = self.settings
        where = f"connect {s.host}:{s.port}"
        with _translate_errors(where):
            context = self._ssl_context() if s.security == "ssl" else None
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(s.host, s.port, ssl=context), s.timeout_s
            )
            greeting = await self._read_response(s.timeout_s)
            if s.security == "starttls":
                await self.command("STARTTLS")
                writer = self._writer
                assert writer is not None  # connected above
                await asyncio.wait_for(
                    writer.start_tls(self._ssl_context(), server_hostname=s.host),
                    s.timeout_s,
                )
        self._note_capabilities(greeting)
        await self._login()
        if not self.capabilities or "IMAP4REV1" not in self.capabilities:
            await self.command("CAPABILITY")

    async def _login(self) -> None:
        s = self.settings
        try:
            if s.auth == "password" or s.oauth is None:
                await self.command(
                    b"LOGIN " + _quoted(s.username) + b" " + _quoted(s.password.get_secret_value()),
                    what="LOGIN",
                )
                return
            assert s.oauth is not None
            token = await asyncio.to_thread(oauth.TOKENS.token, s.oauth)
            if s.auth == "oauthbearer":
                blob = f"n,a={s.username},\x01auth=Bearer {token}\x01\x01"
                mechanism = "OAUTHBEARER"
            else:
                blob = f"user={s.username}\x01auth=Bearer {token}\x01\x01"
                mechanism = "XOAUTH2"
            initial = base64.b64encode(blob.encode())
            await self.command(f"AUTHENTICATE {mechanism} ".encode() + initial, what="AUTHENTICATE")
        except MailboxCommandFailed as exc:
            if any(code in str(exc) for code in TEMPORARY_LOGIN_CODES):
                raise MailboxUnavailable(f"login refused for now: {exc}") from exc
            raise MailboxLoginRejected(str(exc)) from exc

    def _note_capabilities(self, response: bytes) -> None:
        match = re.search(rb"\[CAPABILITY ([^\]]*)\]", response) or re.match(
            rb"^\* CAPABILITY (.*)\r\n$", response
        )
        if match:
            self.capabilities = {c.upper() for c in match.group(1).decode().split()}

    async def command(
        self, text: str | bytes, *, what: str | None = None, timeout_s: float | None = None
    ) -> list[bytes]:
        """Send one command; its untagged responses (NO or BAD raise ``MailboxCommandFailed``)."""
        line = text.encode() if isinstance(text, str) else text
        what = what or line.split(b" ", 1)[0].decode()
        tag = await self._send(line, what)
        untagged: list[bytes] = []
        while True:
            response = await self._read_response(timeout_s or self.settings.timeout_s, what)
            if (match := _TAGGED.match(response)) is not None and match.group(1) == tag:
                if match.group(2) != b"OK":
                    raise MailboxCommandFailed(
                        f"{what}: {response.decode(errors='replace')[:200]!r}"
                    )
                self._note_capabilities(response)
                return untagged
            self._note_capabilities(response)
            untagged.append(response)

    async def _send(self, line: bytes, what: str) -> bytes:
        self._tags += 1
        tag = b"W%d" % self._tags
        await self._write(tag + b" " + line + b"\r\n", what)
        return tag

    async def _write(self, data: bytes, what: str) -> None:
        if self._writer is None:
            raise MailboxUnavailable(f"{what}: not connected")
        with _translate_errors(what):
            self._writer.write(data)
            await self._writer.drain()

    async def _read_response(self, timeout_s: float, what: str = "read") -> bytes:
        """One whole response: a line, and the literals it announces with the lines after them."""
        if self._reader is None:
            raise MailboxUnavailable(f"{what}: not connected")
        with _translate_errors(what):
            return await asyncio.wait_for(self._read_whole(self._reader), timeout_s)

    @staticmethod
    async def _read_whole(reader: asyncio.StreamReader) -> bytes:
        parts = []
        while True:
            line = await reader.readuntil(b"\r\n")
            parts.append(line)
            if (match := _LITERAL.search(line)) is None:
                return b"".join(parts)
            parts.append(await reader.readexactly(int(match.group(1))))

    async def examine(self, folder: str) -> int:
        """EXAMINE ``folder`` (read-only: no flag changes); its message count."""
        try:
            untagged = await self.command(
                b"EXAMINE " + encode_folder(folder), what=f"EXAMINE {folder!r}"
            )
        except MailboxCommandFailed as exc:
            if any(mark.lower() in str(exc).lower() for mark in MISSING_FOLDER_MARKS):
                raise MailboxFolderMissing(str(exc)) from exc
            raise
        counts = [
            int(m.group(1))
            for r in untagged
            if (m := _EXISTS.match(r)) and m.group(2).upper() == b"EXISTS"
        ]
        return counts[-1] if counts else 0

    async def notify(self, folders: list[str]) -> dict[str, int]:
        """NOTIFY SET for new and expunged mail in ``folders``; their UIDNEXT as of now."""
        self._notified = list(folders)
        return _uidnexts(await self._notify_set(folders))

    async def _notify_set(self, folders: list[str]) -> list[bytes]:
        names = b" ".join(encode_folder(folder) for folder in folders)
        return await self.command(
            b"NOTIFY SET STATUS (mailboxes (" + names + b") (MessageNew MessageExpunge))",
            what="NOTIFY SET",
        )

    async def listen(self, check_s: float) -> AsyncIterator[FolderNews]:
        """What the server says unasked (NOTIFY set); after ``check_s`` without a word, what a
        NOOP turns up.

        A NOOP proves the connection alive and makes Dovecot look for changes at once. News
        it turns up is news the server did not send by itself: Dovecot's NOTIFY watches the
        account's mailbox list index log by its inode, and once that log is renewed (every 5
        minutes or more while mail comes) it hears of new mail only every
        ``mailbox_idle_check_interval`` (30 s). So NOTIFY is set anew, on the new log; NONE
        first, as a second SET in a session leaves Dovecot watching nothing. The new SET's
        STATUS replies come out as news too (the caller keeps what is higher).
        """
        while True:
            try:
                response = await self._read_response(check_s, "NOTIFY wait")
            except MailboxUnavailable as exc:
                if not isinstance(exc.__cause__, TimeoutError):
                    raise
                missed = _news_in(await self.command("NOOP"))
                for item in missed:
                    yield item
                if any(item.uidnext is not None for item in missed):
                    for item in await self._notify_anew():
                        yield item
                continue
            if (news := parse_news(response)) is not None:
                yield news
            elif response.startswith(b"* BYE"):
                raise MailboxUnavailable(f"server ended the session: {response[:200]!r}")

    async def _notify_anew(self) -> list[FolderNews]:
        """NOTIFY NONE, then SET again on the same folders; what the replies say."""
        self.renewals += 1
        logger.debug("IMAP watch of %s: NOTIFY set anew", self.settings.username)
        untagged = await self.command("NOTIFY NONE")
        untagged += await self._notify_set(self._notified)
        return _news_in(untagged)

    async def idle(self, timeout_s: float) -> list[FolderNews]:
        """One IDLE on the selected folder: until it announces mail or ``timeout_s`` passes."""
        tag = await self._send(b"IDLE", "IDLE")
        news: list[FolderNews] = []
        while True:  # up to the continuation; a server may announce mail before it
            response = await self._read_response(self.settings.timeout_s, "IDLE")
            if response.startswith(b"+"):
                break
            if (match := _TAGGED.match(response)) is not None and match.group(1) == tag:
                raise MailboxCommandFailed(f"IDLE: {response.decode(errors='replace')[:200]!r}")
            if (found := parse_news(response)) is not None:
                news.append(found)
        try:
            while not news:
                response = await self._read_response(timeout_s, "IDLE wait")
                if (found := parse_news(response)) is not None:
                    news.append(found)
                elif response.startswith(b"* BYE"):
                    raise MailboxUnavailable(f"server ended the session: {response[:200]!r}")
        except MailboxUnavailable as exc:
            if not isinstance(exc.__cause__, TimeoutError):
                raise
        await self._write(b"DONE\r\n", "DONE")
        while True:
            response = await self._read_response(self.settings.timeout_s, "DONE")
            if (match := _TAGGED.match(response)) is not None and match.group(1) == tag:
                return news
            if (found := parse_news(response)) is not None:
                news.append(found)

    async def close(self) -> None:
        """Say DONE (an IDLE may be running) and LOGOUT, close the socket; never raises.

        The answers are not waited for: a stop must not wait on a server (a watcher stops
        within 3 s with hundreds of connections open), and the server ends the session when
        the socket closes anyway.
        """
        writer, self._writer, self._reader = self._writer, None, None
        if writer is None:
            return
        self._tags += 1
        try:
            writer.write(b"DONE\r\nW%d LOGOUT\r\n" % self._tags)
        except (OSError, RuntimeError) as exc:  # the transport is gone already
            logger.debug("IMAP watch logout of %s: %r", self.settings.name, exc)
        writer.close()


def _news_in(untagged: list[bytes]) -> list[FolderNews]:
    return [news for response in untagged if (news := parse_news(response)) is not None]


def _uidnexts(untagged: list[bytes]) -> dict[str, int]:
    """The UIDNEXT of each folder a STATUS response names."""
    found = {}
    for response in untagged:
        news = parse_news(response)
        if news is not None and news.folder is not None and news.uidnext is not None:
            found[news.folder] = news.uidnext
    return found


def parse_news(response: bytes) -> FolderNews | None:
    """The news in an untagged response, or None for anything else."""
    if (match := _EXISTS.match(response)) is not None:
        kind = match.group(2).upper()
        return FolderNews(None, count=int(match.group(1)), recent=kind == b"RECENT")
    if (match := _STATUS.match(response)) is not None:
        uidnext = _UIDNEXT.search(match.group(2))
        return FolderNews(
            decode_folder(match.group(1)), uidnext=int(uidnext.group(1)) if uidnext else None
        )
    return None
