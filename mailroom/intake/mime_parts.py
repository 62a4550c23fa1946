"""The parts of the mail being parsed: its leaves numbered as IMAP numbers sections, which
of them are files, their names and bytes, and the mail inside a ``message/rfc822`` part.

``parsing`` sets ``ELIDED``, ``HINTS`` and ``RAW`` for the mail it parses; everything here
reads the mail through them, so a big body cut out of the parser's text is read whole
(``big_parts``), a raw 8-bit name is decoded in the mail's own charsets (``charsets``), and
a part refused for its size is found in the raw mail (``body_span``).
"""

from __future__ import annotations

import binascii
import email
import quopri
import re
from contextvars import ContextVar
from dataclasses import dataclass
from email import policy
from email.message import Message
from email.utils import collapse_rfc2231_value
from urllib.parse import unquote

from mailroom.intake.big_parts import ElidedMail
from mailroom.intake.charsets import Hints, no_hints
from mailroom.intake.filetypes import MEDIA_EXTENSIONS
from mailroom.intake.headers import decode_words

#: The big mail being parsed, when its big bodies were cut out of the parser's text.
ELIDED: ContextVar[ElidedMail | None] = ContextVar("elided", default=None)
#: The charsets the mail being parsed declares, for raw 8-bit file names.
HINTS: ContextVar[Hints] = ContextVar("hints", default=no_hints)


@dataclass
class RawMail:
    """The raw bytes of the mail being parsed, and how far they were searched for bodies."""

    data: bytes
    searched: int = 0


#: The mail being parsed, where the bodies of parts refused for size are.
RAW: ContextVar[RawMail | None] = ContextVar("raw", default=None)


def body_span(part: Message) -> tuple[int, int] | None:
    """Where the undecoded body of the leaf ``part`` is in the raw mail, if it is there as is.

    Searched after the bodies found before it, so a file attached twice is found twice.
    """
    payload = part.get_payload()
    raw = RAW.get()
    if not isinstance(payload, str) or len(payload) < MIN_REMOVED_CHARS or raw is None:
        return None
    try:
        needle = payload.encode("ascii", "surrogateescape")
    except UnicodeEncodeError:  # text that did not come from the raw bytes as it is
        return None
    start = raw.data.find(needle, raw.searched)
    if start < 0:
        return None
    raw.searched = start + len(needle)
    return start, start + len(needle)


#: Bodies shorter than this are not searched for in the raw mail (they may occur anywhere).
MIN_REMOVED_CHARS = 256


#: Transfer encodings a ``message/rfc822`` part should not have (RFC 2046), but is sent with.
_ENCODED = ("base64", "quoted-printable")


def inner_message(part: Message) -> tuple[Message | None, bytes | None]:
    """The mail inside a ``message/rfc822`` part, and its bytes when they had to be decoded.

    The parser reads the part's body as a mail whatever its transfer encoding; a base64 or
    quoted-printable one (some clients forward so) comes out as a mail without headers whose
    text is the encoded mail: it is decoded and parsed again.
    """
    if part.get_content_type() not in _MAIL_TYPES or not part.is_multipart():
        return None, None
    payload = part.get_payload()
    inner = payload[0] if isinstance(payload, list) and payload else None
    if not isinstance(inner, Message):
        return None, None
    encoding = str(part.get("Content-Transfer-Encoding", "")).strip().lower()
    if encoding not in _ENCODED:
        return inner, None
    try:
        decoded = _decoded_mail(inner, encoding)
    except (binascii.Error, ValueError):
        decoded = None
    if not decoded:
        return inner, None  # not encoded after all: the mail as the parser read it
    return email.message_from_bytes(decoded, policy=policy.compat32), decoded


def _decoded_mail(inner: Message, encoding: str) -> bytes | None:
    """The bytes of a mail sent base64 or quoted-printable inside a ``message/rfc822`` part."""
    elided = ELIDED.get()
    if encoding == "base64":
        text = inner.get_payload()
        if inner.keys() or not isinstance(text, str):
            return None  # a base64 body has no header lines: this is a mail as it is
        if elided is not None:
            text = elided.restore(text)
        return binascii.a2b_base64(text.encode("ascii", "ignore"))
    data = inner.as_bytes()
    return quopri.decodestring(elided.restore_bytes(data) if elided else data)


#: Parts that hold a whole mail: opened like a forwarded mail, named or not.
_MAIL_TYPES = ("message/rfc822", "message/global")
#: Parts of a delivery or read report that are the report's text, not an attachment.
_REPORT_TYPES = ("message/delivery-status", "message/disposition-notification")


def content_id(part: Message) -> str | None:
    value = part.get("Content-ID")
    if not isinstance(value, str):
        return None
    return value.strip().strip("<>").strip().lower() or None


#: A ``cid:`` reference in HTML, up to the quote, bracket or space that ends it.
_CID_REFERENCE = re.compile(rb"""cid:([^"'\s>)]{1,500})""", re.IGNORECASE)
#: HTML bodies larger than this are searched for ``cid:`` references in their start only, bytes.
MAX_HTML_BYTES = 2 * 1024 * 1024


def referenced_content_ids(part: Message) -> set[str]:
    """Content-IDs the HTML bodies of ``part`` show inline (not those of attached mails)."""
    if part.get_content_maintype() == "multipart":
        found: set[str] = set()
        for child in part.get_payload() or []:
            if isinstance(child, Message):
                found |= referenced_content_ids(child)
        return found
    if part.get_content_type() != "text/html":
        return set()
    html = payload(part)[:MAX_HTML_BYTES]
    return {
        unquote(m.decode("ascii", "replace")).strip().lower() for m in _CID_REFERENCE.findall(html)
    }


#: A leaf part with its content type, file name (each read once: they are not cheap) and
#: section.
Leaf = tuple[Message, str, str | None, str]


def leaf_parts(message: Message, prefix: str) -> list[Leaf]:
    """Every leaf part of ``message`` depth first, numbered as IMAP numbers sections.

    Attached mails are leaves here (their own parts are walked when they are opened).
    """
    if message.get_content_maintype() == "multipart" and isinstance(message.get_payload(), list):
        return _leaves(message, prefix.removesuffix("."))
    return _leaves(message, f"{prefix}1")


def _leaves(part: Message, section: str) -> list[Leaf]:
    content_type = part.get_content_type()
    payload = part.get_payload()
    if content_type.startswith("multipart/") and isinstance(payload, list):
        leaves: list[Leaf] = []
        children = [child for child in payload if isinstance(child, Message)]
        for number, child in enumerate(children, start=1):
            leaves.extend(_leaves(child, f"{section}.{number}" if section else str(number)))
        return leaves
    # A multipart without its parts (no boundary, or a broken one) is a leaf: its text.
    return [(part, content_type, _filename(part), section)]


def is_attachment(part: Message, content_type: str, filename: str | None) -> bool:
    """Whether a leaf part is a file; the others are the text of the mail (its body)."""
    if content_type in _MAIL_TYPES:
        return True  # a forwarded mail, even inline and unnamed, may carry documents
    if filename:
        return True  # inline parts with a name (images, PDFs in the body) are attachments too
    if (part.get_content_disposition() or "").lower() == "attachment":
        return True
    maintype = content_type.partition("/")[0]
    if content_type in _REPORT_TYPES or maintype == "multipart":
        return False
    # Text is the message itself, unless its type is a document's (an unnamed CSV); anything
    # else is content worth keeping, inline or not.
    return maintype != "text" or content_type in MEDIA_EXTENSIONS


def _filename(part: Message) -> str | None:
    if not _may_be_named(part):
        return None
    try:
        name = part.get_filename() or part.get_param("name")
        if isinstance(name, tuple):  # RFC 2231 value of a ``name`` parameter
            name = collapse_rfc2231_value(name)
        # Non-standard but common: RFC 2047 words inside a quoted file name.
        return decode_words(str(name), HINTS.get()) if name else None
    except Exception:  # malformed parameters or encoded words
        return None


def _may_be_named(part: Message) -> bool:
    """Whether a ``filename`` or ``name`` parameter can be there at all.

    A mail's text and HTML bodies have none, and ``get_filename`` parses both headers'
    parameters to find that out (a tenth to a fifth of a small mail's parse). Parameter names are
    matched case-blind on the headers' text, as the parser reads them.
    """
    for header in ("content-disposition", "content-type"):
        value = part.get(header)
        if value is not None and "name" in str(value).lower():
            return True
    return False


def payload(part: Message) -> bytes:
    if part.is_multipart():  # an attached mail (message/rfc822): its bytes, whole
        payload = part.get_payload()
        inner = payload[0] if isinstance(payload, list) and payload else part
        try:
            data = inner.as_bytes() if isinstance(inner, Message) else b""
        except Exception:  # a part the generator cannot re-serialize
            return b""
        elided = ELIDED.get()
        return elided.restore_bytes(data) if elided else data
    if (elided := ELIDED.get()) is not None:
        elided.restore_part(part)
    try:
        decoded = part.get_payload(decode=True)
    except Exception:  # broken transfer encoding: keep what is there
        decoded = None
    if isinstance(decoded, bytes):
        return decoded
    raw = part.get_payload()
    return raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else b""
