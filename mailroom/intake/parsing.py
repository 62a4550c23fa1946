"""Parse one raw mail: headers we keep, attachments with safe names, limits applied.

Stdlib ``email`` with its ``compat32`` policy (ten times faster than
``policy.default`` on small mails, which matters at hundreds of mails a second);
RFC 2047 words are decoded here and RFC 2231 names by ``get_filename``. Mail is untrusted: every header read tolerates malformed or
non-UTF-8 input, names lose path parts and control characters, and the size
and count limits decide which attachments are stored at all.
"""

from __future__ import annotations

import email
import re
from dataclasses import dataclass, field
from email import policy
from email.header import Header, decode_header
from email.message import Message
from email.utils import collapse_rfc2231_value, getaddresses
from pathlib import PurePosixPath

from mailroom.adapters.storage import sha256_hex

#: Longest stored file name, in characters (``stored_file.original_name`` is 255).
MAX_NAME_CHARS = 200
#: Longest header value kept, in characters.
MAX_HEADER_CHARS = 2000
#: Longest extension kept in a name or key, in characters.
MAX_EXTENSION_CHARS = 10

#: Extension → (file type, pipeline); types missing here are stored as SKIPPED.
RECOGNIZABLE: dict[str, tuple[str, str]] = {
    "csv": ("csv", "tabular"),
    "tsv": ("tsv", "tabular"),
    "xlsx": ("xlsx", "tabular"),
    "xls": ("xls", "tabular"),
    # Plain-text documents ("Key: Value" lines) go to the tabular pipeline too; the reference
    # recognizer reads them. Users send notes that way.
    "txt": ("txt", "tabular"),
    "pdf": ("pdf", "image"),
    "png": ("png", "image"),
    "jpeg": ("jpeg", "image"),
    "jpg": ("jpeg", "image"),
    "tiff": ("tiff", "image"),
    "tif": ("tiff", "image"),
}

#: Media type → extension, for parts whose name says nothing.
MEDIA_EXTENSIONS: dict[str, str] = {
    "text/csv": "csv",
    "text/tab-separated-values": "tsv",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "application/vnd.ms-excel": "xls",
    "application/pdf": "pdf",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/tiff": "tiff",
}

#: Names for unnamed parts that are not recognizable.
OTHER_EXTENSIONS: dict[str, str] = {
    "message/rfc822": "eml",
    "text/plain": "txt",
    "text/html": "html",
}


@dataclass(frozen=True)
class Limits:
    max_attachment_bytes: int
    max_mail_bytes: int
    max_attachments: int


@dataclass
class ParsedAttachment:
    """One attachment; ``skip_reason`` set means it is recorded but not stored."""

    name: str
    media_type: str
    data: bytes
    file_type: str
    pipeline: str | None
    skip_reason: str | None = None
    #: Size of the decoded part in bytes (kept when ``data`` is dropped for a limit).
    size: int = 0

    @property
    def extension(self) -> str:
        return _extension(self.name)


@dataclass
class ParsedMail:
    sha256: str
    size: int
    message_id: str | None = None
    sender: str | None = None
    return_path: str | None = None
    authentication_results: str | None = None
    subject: str | None = None
    attachments: list[ParsedAttachment] = field(default_factory=list)
    #: Why the mail's content was not processed (too large), else None.
    problem: str | None = None


def parse_mail(raw: bytes, limits: Limits) -> ParsedMail:
    """Parse ``raw``; never raises on malformed mail, records problems instead."""
    parsed = ParsedMail(sha256=sha256_hex(raw), size=len(raw))
    if len(raw) > limits.max_mail_bytes:
        parsed.problem = f"mail of {len(raw)} bytes exceeds the limit of {limits.max_mail_bytes}"
        return parsed
    message = email.message_from_bytes(raw, policy=policy.compat32)
    parsed.message_id = _header(message, "Message-ID")
    parsed.sender = _sender(message)
    return_path = _header(message, "Return-Path")
    parsed.return_path = return_path.strip("<> ") if return_path else None
    parsed.authentication_results = _header(message, "Authentication-Results", join=True)
    parsed.subject = _header(message, "Subject")
    parsed.attachments = _attachments(message, limits)
    return parsed


def clean_text(value: str, limit: int = MAX_HEADER_CHARS) -> str:
    """Valid UTF-8 text without NUL or other control characters, at most ``limit`` chars.

    Raw 8-bit header bytes arrive as surrogate escapes; they are read as UTF-8
    when they are, else as Latin-1, so nothing unencodable reaches Postgres.
    """
    if not value.isascii():
        if _ESCAPED_BYTE.search(value):
            data = value.encode("utf-8", "surrogateescape")
            try:
                value = data.decode("utf-8")
            except UnicodeDecodeError:
                value = data.decode("latin-1")
        value = value.encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub(" ", value).strip()[:limit]


#: A raw 8-bit byte carried in a str (``surrogateescape``).
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")

#: Control characters (Unicode Cc and Cs), line separators and the bidi overrides
#: (``invoice\u202efdp.exe``) that disguise names.
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _header(message: Message, name: str, *, join: bool = False) -> str | None:
    values: list[str] = []
    try:
        values = [decode_words(v) for v in message.get_all(name) or []]
    except Exception:  # malformed header the decoder chokes on: fall back to its raw text
        values = [str(v) for k, v in message.raw_items() if k.lower() == name.lower()]
    values = [clean_text(v) for v in values]
    values = [v for v in values if v]
    if not values:
        return None
    return "\n".join(values)[:MAX_HEADER_CHARS] if join else values[0]


def decode_words(value: str | Header) -> str:
    """Header text with RFC 2047 encoded words decoded; unknown charsets never raise."""
    if isinstance(value, str):
        if "=?" not in value:
            return value  # no encoded words (``decode_header`` would return it as is)
        if not value.isascii() and _ESCAPED_BYTE.search(value):
            return value  # raw 8-bit text, not encoded words: clean_text reads it
    out = []
    for chunk, charset in decode_header(value):
        out.append(chunk if isinstance(chunk, str) else _bytes_text(chunk, charset))
    return "".join(out)


def _bytes_text(data: bytes, charset: str | None) -> str:
    if charset and charset.lower() not in ("unknown-8bit", "us-ascii", "ascii"):
        try:
            return data.decode(charset, "replace")
        except LookupError:  # a charset Python does not know
            pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _sender(message: Message) -> str | None:
    sender = _header(message, "From")
    if sender is None:
        return None
    try:
        addresses = getaddresses([sender])
    except Exception:  # unparsable address list: the decoded header text is kept instead
        addresses = []
    if addresses and "@" in addresses[0][1]:
        return clean_text(addresses[0][1])
    return sender


def safe_name(name: str | None, *, index: int, media_type: str) -> str:
    """A file name safe to show and store: last path part, no control chars, bounded, never empty."""
    cleaned = clean_text(name or "", limit=10 * MAX_NAME_CHARS)
    cleaned = re.split(r"[/\\]", cleaned)[-1]
    cleaned = cleaned.strip(" .")
    if not cleaned:
        ext = MEDIA_EXTENSIONS.get(media_type) or OTHER_EXTENSIONS.get(media_type, "bin")
        return f"attachment-{index}.{ext}"
    if len(cleaned) > MAX_NAME_CHARS:
        ext = _extension(cleaned)
        tail = f".{ext}" if ext else ""
        cleaned = cleaned[: MAX_NAME_CHARS - len(tail)].rstrip(" .") + tail
    return cleaned


def _extension(name: str) -> str:
    suffix = PurePosixPath(name).suffix.lower().lstrip(".")
    if not suffix or len(suffix) > MAX_EXTENSION_CHARS or not suffix.isalnum():
        return ""
    return suffix


def classify(name: str, media_type: str) -> tuple[str, str | None]:
    """(file type, pipeline) by extension, then media type; pipeline None means SKIPPED."""
    ext = _extension(name)
    if ext in RECOGNIZABLE:
        return RECOGNIZABLE[ext]
    by_media = MEDIA_EXTENSIONS.get(media_type)
    if not ext and by_media:
        return RECOGNIZABLE[by_media]
    return (ext or "unknown", None)


def _attachments(message: Message, limits: Limits) -> list[ParsedAttachment]:
    found: list[ParsedAttachment] = []
    for part, content_type, filename in _leaf_parts(message):
        index = len(found) + 1
        media_type = clean_text(content_type, limit=255).lower()
        name = safe_name(filename, index=index, media_type=media_type)
        file_type, pipeline = classify(name, media_type)
        data = _payload(part)
        attachment = ParsedAttachment(name, media_type, data, file_type, pipeline, size=len(data))
        too_many = index > limits.max_attachments
        too_big = len(data) > limits.max_attachment_bytes
        if too_many:
            attachment.skip_reason = (
                f"attachment {index} is over the limit of {limits.max_attachments} per mail"
            )
        elif too_big:
            attachment.skip_reason = (
                f"attachment of {len(data)} bytes exceeds the limit of "
                f"{limits.max_attachment_bytes}"
            )
        elif pipeline is None:
            attachment.skip_reason = f"file type {file_type!r} is not recognized"
        if too_many or too_big:
            attachment.data = b""  # recorded, never stored
        found.append(attachment)
    return found


#: A leaf part with its content type and file name, each read once (they are not cheap).
_Leaf = tuple[Message, str, str | None]


def _leaf_parts(part: Message) -> list[_Leaf]:
    """Attachment candidates depth first: leaves of nested multiparts, attached mails whole."""
    content_type = part.get_content_type()
    maintype = content_type.partition("/")[0]
    if maintype == "multipart":
        leaves: list[_Leaf] = []
        for child in part.get_payload() or []:
            if isinstance(child, Message):
                leaves.extend(_leaf_parts(child))
        return leaves
    filename = _filename(part)
    return [(part, content_type, filename)] if _is_attachment(part, maintype, filename) else []


def _is_attachment(part: Message, maintype: str, filename: str | None) -> bool:
    disposition = (part.get_content_disposition() or "").lower()
    if disposition == "attachment":
        return True
    if filename:
        return True  # inline parts with a name (images, PDFs in the body) are attachments too
    if disposition == "inline":
        return False
    # Undisposed bodies: text is the message itself, anything else is content worth keeping.
    return maintype not in ("text", "multipart")


def _filename(part: Message) -> str | None:
    try:
        name = part.get_filename() or part.get_param("name")
        if isinstance(name, tuple):  # RFC 2231 value of a ``name`` parameter
            name = collapse_rfc2231_value(name)
        # Non-standard but common: RFC 2047 words inside a quoted file name.
        return decode_words(str(name)) if name else None
    except Exception:  # malformed parameters or encoded words
        return None


def _payload(part: Message) -> bytes:
    if part.is_multipart():  # an attached mail (message/rfc822): its bytes, whole
        payload = part.get_payload()
        inner = payload[0] if isinstance(payload, list) and payload else part
        try:
            return inner.as_bytes() if isinstance(inner, Message) else b""
        except Exception:  # a part the generator cannot re-serialize
            return b""
    try:
        data = part.get_payload(decode=True)
    except Exception:  # broken transfer encoding: keep what is there
        data = None
    if isinstance(data, bytes):
        return data
    raw = part.get_payload()
    return raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else b""
