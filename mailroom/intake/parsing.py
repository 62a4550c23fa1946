"""Parse one raw mail: headers we keep, attachments with safe names, limits applied.

Stdlib ``email`` with its ``compat32`` policy (ten times faster than
``policy.default`` on small mails, which matters at hundreds of mails a second);
RFC 2047 words are decoded here and RFC 2231 names by ``get_filename``. Mail is
untrusted: every header read tolerates malformed or non-UTF-8 input (bytes no
charset explains become U+FFFD), names lose path parts and control characters,
and the size and count limits decide which attachments are stored at all (one
over its size limit is sized from its base64, never decoded; the big bodies of a
big mail never go through the parser: ``big_parts``). Forwarded mails and
winmail.dat are opened (``containers``) down to a depth limit, each file
recording the container it came from.
"""

from __future__ import annotations

import email
import re
from contextvars import ContextVar
from dataclasses import dataclass, field
from email import policy
from email.message import Message
from email.utils import collapse_rfc2231_value
from typing import TYPE_CHECKING
from urllib.parse import unquote

from mailroom.adapters.storage import sha256_hex
from mailroom.intake import boundaries
from mailroom.intake.big_parts import ElidedMail, elide_big_bodies, read_part
from mailroom.intake.containers import open_container
from mailroom.intake.filetypes import (
    IMAGE_TYPES,
    MEDIA_EXTENSIONS,
    RECOGNIZABLE,
    classify,
    extension,
)
from mailroom.intake.headers import clean_text, decode_words, header_text, sender_address

if TYPE_CHECKING:
    from mailroom.settings import IntakeSettings, MailboxSettings

__all__ = [
    "MEDIA_EXTENSIONS",
    "RECOGNIZABLE",
    "classify",
    "clean_text",
    "parse_mail",
    "parse_oversize",
    "safe_name",
]

# Each mail's MIME boundary cost the stdlib parser a regular expression compile.
boundaries.install()

#: Longest stored file name, in characters (``stored_file.original_name`` is 255).
MAX_NAME_CHARS = 200
#: Longest recorded path of a file inside its containers, in characters.
MAX_PATH_CHARS = 1000
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
    #: How deep forwarded mails and winmail.dat are opened; 0 keeps every container whole.
    max_nesting: int = 3
    #: Store inline images (referenced by Content-ID, or smaller than ``min_image_bytes``)
    #: without sending them to recognition.
    skip_inline_images: bool = True
    #: Images smaller than this are decoration (logos, icons), not documents, in bytes.
    min_image_bytes: int = 4096

    @classmethod
    def for_mailbox(cls, intake: IntakeSettings, mailbox: MailboxSettings) -> Limits:
        return cls(
            max_attachment_bytes=intake.max_attachment_bytes,
            max_mail_bytes=intake.max_mail_bytes,
            max_attachments=intake.max_attachments,
            max_nesting=intake.max_nesting,
            skip_inline_images=mailbox.skip_inline_images,
            min_image_bytes=intake.min_image_bytes,
        )


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
    #: Which rule decided ``file_type``: extension, media_type or content.
    type_rule: str | None = None
    #: Set for a container whose files were extracted (a forwarded mail, winmail.dat).
    container_reason: str | None = None
    #: Position of the container this file came out of, in the mail's list; None: the mail.
    parent: int | None = None
    #: Where the file sits in the mail: ``forwarded.eml/invoice.csv``.
    path: str = ""

    @property
    def extension(self) -> str:
        return extension(self.name)


@dataclass
class ParsedMail:
    #: SHA-256 (hex) of the raw mail; of its header block alone when ``problem`` is set.
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
    if len(raw) > limits.max_mail_bytes:  # fetched whole after all: read its headers only
        return parse_oversize(_header_block(raw), len(raw), limits)
    parsed = ParsedMail(sha256=sha256_hex(raw), size=len(raw))
    # Big part bodies are read from ``raw``, not through the parser (see big_parts).
    elided = elide_big_bodies(raw)
    message = email.message_from_bytes(elided.text if elided else raw, policy=policy.compat32)
    _read_headers(parsed, message)
    token = _ELIDED.set(elided)
    try:
        parsed.attachments = _attachments(message, limits)
    finally:
        _ELIDED.reset(token)
    return parsed


#: The big mail being parsed, when its big bodies were cut out of the parser's text.
_ELIDED: ContextVar[ElidedMail | None] = ContextVar("elided", default=None)


def parse_oversize(header: bytes, size: int | None, limits: Limits) -> ParsedMail:
    """A mail over ``max_mail_bytes`` from its header block alone: headers and the problem.

    Its body is never read, so the mail is known by its header block's hash.
    """
    parsed = ParsedMail(sha256=sha256_hex(header), size=size or len(header))
    told = f"of {size} bytes " if size is not None else ""
    parsed.problem = (
        f"mail {told}exceeds the limit of {limits.max_mail_bytes}: oversize, its body was not read"
    )
    _read_headers(parsed, email.message_from_bytes(header, policy=policy.compat32))
    return parsed


def _header_block(raw: bytes) -> bytes:
    """The header block of ``raw``, up to the first empty line."""
    ends = [cut for cut in (raw.find(b"\r\n\r\n"), raw.find(b"\n\n")) if cut >= 0]
    return raw[: min(ends) + 2] if ends else raw


def _read_headers(parsed: ParsedMail, message: Message) -> None:
    parsed.message_id = header_text(message, "Message-ID")
    parsed.sender = sender_address(message)
    return_path = header_text(message, "Return-Path")
    parsed.return_path = return_path.strip("<> ") if return_path else None
    parsed.authentication_results = header_text(message, "Authentication-Results", join=True)
    parsed.subject = header_text(message, "Subject")


def safe_name(name: str | None, *, index: int, media_type: str) -> str:
    """A file name safe to show and store: last path part, no control chars, bounded, never empty."""
    cleaned = clean_text(name or "", limit=10 * MAX_NAME_CHARS)
    cleaned = re.split(r"[/\\]", cleaned)[-1]
    cleaned = cleaned.strip(" .")
    if not cleaned:
        ext = MEDIA_EXTENSIONS.get(media_type) or OTHER_EXTENSIONS.get(media_type, "bin")
        return f"attachment-{index}.{ext}"
    if len(cleaned) > MAX_NAME_CHARS:
        ext = extension(cleaned)
        tail = f".{ext}" if ext else ""
        cleaned = cleaned[: MAX_NAME_CHARS - len(tail)].rstrip(" .") + tail
    return cleaned


def _attachments(message: Message, limits: Limits) -> list[ParsedAttachment]:
    found: list[ParsedAttachment] = []
    _collect(message, limits, found, parent=None, depth=0)
    return found


def _collect(
    message: Message,
    limits: Limits,
    found: list[ParsedAttachment],
    *,
    parent: int | None,
    depth: int,
) -> None:
    """Add the attachments of ``message`` to ``found``, opening containers down to the limit."""
    cids = _referenced_content_ids(message) if limits.skip_inline_images else set()
    for part, content_type, filename in _leaf_parts(message):
        read = read_part(part, _ELIDED.get(), limits.max_attachment_bytes)
        data, size = read if read is not None else (_payload(part), None)
        attachment = _attachment(found, limits, filename, content_type, data, size=size)
        content_id = _content_id(part)
        if (
            content_id in cids
            and attachment.skip_reason is None
            and (attachment.file_type in IMAGE_TYPES or attachment.media_type.startswith("image/"))
        ):
            attachment.skip_reason = _INLINE_IMAGE
        _place(found, attachment, parent)
        _open(found, limits, attachment, _inner_message(part), depth=depth)


#: Why a part referenced from the HTML body is not sent to recognition.
_INLINE_IMAGE = "inline image of the mail's body (referenced by Content-ID), not a document"


def _attachment(
    found: list[ParsedAttachment],
    limits: Limits,
    filename: str | None,
    content_type: str,
    data: bytes,
    *,
    size: int | None = None,
) -> ParsedAttachment:
    """One attachment; ``size`` is given when ``data`` is only the start of a part too big."""
    index = len(found) + 1
    size = len(data) if size is None else size
    media_type = clean_text(content_type, limit=255).lower()
    name = safe_name(filename, index=index, media_type=media_type)
    typing = classify(name, media_type, data)
    attachment = ParsedAttachment(
        name, media_type, data, typing.file_type, typing.pipeline, size=size
    )
    attachment.type_rule = typing.rule
    too_many = index > limits.max_attachments
    too_big = size > limits.max_attachment_bytes
    if too_many:
        attachment.skip_reason = (
            f"attachment {index} is over the limit of {limits.max_attachments} per mail"
        )
    elif too_big:
        attachment.skip_reason = (
            f"attachment of {size} bytes exceeds the limit of {limits.max_attachment_bytes}"
        )
    elif typing.file_type == "executable":
        attachment.skip_reason = "executable content is never a document"
    elif typing.pipeline is None:
        attachment.skip_reason = f"file type {typing.file_type!r} is not recognized"
    elif (
        limits.skip_inline_images
        and typing.file_type in IMAGE_TYPES
        and size < limits.min_image_bytes
    ):
        attachment.skip_reason = (
            f"image of {size} bytes is under {limits.min_image_bytes}: decoration, not a document"
        )
    if too_many or too_big:
        attachment.data = b""  # recorded, never stored
    return attachment


def _place(found: list[ParsedAttachment], attachment: ParsedAttachment, parent: int | None) -> None:
    attachment.parent = parent
    prefix = f"{found[parent].path}/" if parent is not None else ""
    attachment.path = (prefix + attachment.name)[:MAX_PATH_CHARS]
    found.append(attachment)


def _open(
    found: list[ParsedAttachment],
    limits: Limits,
    container: ParsedAttachment,
    nested: Message | None,
    *,
    depth: int,
) -> None:
    """Extract the files of ``container`` when it is one (forwarded mail, winmail.dat)."""
    if container.skip_reason and not container.data:
        return  # over a limit: neither stored nor opened
    opened = open_container(container.name, container.media_type, container.data, nested)
    if opened is None:
        return
    container.file_type = opened.file_type
    container.pipeline = None
    if depth >= limits.max_nesting:
        container.skip_reason = (
            f"{opened.kind} nested deeper than {limits.max_nesting} levels: kept unopened"
        )
        return
    if opened.error is not None:
        container.skip_reason = f"{opened.kind} could not be opened: {opened.error}"
        return
    container.skip_reason = None
    position = len(found) - 1
    before = len(found)
    if opened.message is not None:
        _collect(opened.message, limits, found, parent=position, depth=depth + 1)
    for item in opened.files:
        inner = _attachment(found, limits, item.name, item.media_type, item.data)
        _place(found, inner, position)
        _open(found, limits, inner, None, depth=depth + 1)
    count = len(found) - before
    container.container_reason = f"{opened.kind}: {count} file{'' if count == 1 else 's'} extracted"


def _inner_message(part: Message) -> Message | None:
    """The mail inside a ``message/rfc822`` part, already parsed with the outer one."""
    if part.get_content_type() != "message/rfc822" or not part.is_multipart():
        return None
    payload = part.get_payload()
    inner = payload[0] if isinstance(payload, list) and payload else None
    return inner if isinstance(inner, Message) else None


def _content_id(part: Message) -> str | None:
    value = part.get("Content-ID")
    if not isinstance(value, str):
        return None
    return value.strip().strip("<>").strip().lower() or None


#: A ``cid:`` reference in HTML, up to the quote, bracket or space that ends it.
_CID_REFERENCE = re.compile(rb"""cid:([^"'\s>)]{1,500})""", re.IGNORECASE)
#: HTML bodies larger than this are searched for ``cid:`` references in their start only, bytes.
MAX_HTML_BYTES = 2 * 1024 * 1024


def _referenced_content_ids(part: Message) -> set[str]:
    """Content-IDs the HTML bodies of ``part`` show inline (not those of attached mails)."""
    if part.get_content_maintype() == "multipart":
        found: set[str] = set()
        for child in part.get_payload() or []:
            if isinstance(child, Message):
                found |= _referenced_content_ids(child)
        return found
    if part.get_content_type() != "text/html":
        return set()
    html = _payload(part)[:MAX_HTML_BYTES]
    return {
        unquote(m.decode("ascii", "replace")).strip().lower() for m in _CID_REFERENCE.findall(html)
    }


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
    if not _may_be_named(part):
        return None
    try:
        name = part.get_filename() or part.get_param("name")
        if isinstance(name, tuple):  # RFC 2231 value of a ``name`` parameter
            name = collapse_rfc2231_value(name)
        # Non-standard but common: RFC 2047 words inside a quoted file name.
        return decode_words(str(name)) if name else None
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


def _payload(part: Message) -> bytes:
    if part.is_multipart():  # an attached mail (message/rfc822): its bytes, whole
        payload = part.get_payload()
        inner = payload[0] if isinstance(payload, list) and payload else part
        try:
            data = inner.as_bytes() if isinstance(inner, Message) else b""
        except Exception:  # a part the generator cannot re-serialize
            return b""
        elided = _ELIDED.get()
        return elided.restore_bytes(data) if elided else data
    if (elided := _ELIDED.get()) is not None:
        elided.restore_part(part)
    try:
        decoded = part.get_payload(decode=True)
    except Exception:  # broken transfer encoding: keep what is there
        decoded = None
    if isinstance(decoded, bytes):
        return decoded
    raw = part.get_payload()
    return raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else b""
