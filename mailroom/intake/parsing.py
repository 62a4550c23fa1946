"""Parse one raw mail: headers we keep, attachments with safe names, limits applied.

Stdlib ``email`` with its ``compat32`` policy (ten times faster than
``policy.default`` on small mails, which matters at hundreds of mails a second);
RFC 2047 words are decoded here and RFC 2231 names by ``get_filename``. Mail is
untrusted: every header read tolerates malformed or non-UTF-8 input (bytes no
charset explains become U+FFFD), names lose path parts and control characters,
and the size and count limits decide which attachments are stored at all (one
over its size limit is sized from its base64, never decoded; the big bodies of a
big mail never go through the parser: ``big_parts``). Forwarded mails and
winmail.dat are opened (``containers``), and zip and tar archives (``archives``,
within a per-mail budget), down to a depth limit, each file recording the
container it came from. Every leaf part (``mime_parts`` walks and reads them) is
accounted for: a file, a skipped file with its reason, or the mail's text
(``ParsedMail.body_parts``).
"""

from __future__ import annotations

import email
import re
from contextvars import ContextVar
from dataclasses import dataclass, field
from email import policy
from email.message import Message
from typing import TYPE_CHECKING

from mailroom.adapters.storage import sha256_hex
from mailroom.intake import boundaries, mime_parts
from mailroom.intake.archives import ArchiveBudget, archive_kind, open_archive
from mailroom.intake.big_parts import elide_big_bodies, read_part
from mailroom.intake.charsets import CharsetHints, Hints
from mailroom.intake.containers import Opened, open_container
from mailroom.intake.filetypes import (
    IMAGE_TYPES,
    MEDIA_EXTENSIONS,
    RECOGNIZABLE,
    classify,
    extension,
)
from mailroom.intake.headers import (
    clean_text,
    header_text,
    read_sender,
)

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
    #: Files the archives of one mail may yield, nested archives' included.
    max_archive_members: int = 1000
    #: Bytes the archives of one mail may expand to, nested archives' included.
    max_archive_bytes: int = 100 * 1024 * 1024
    #: Largest expanded-to-compressed ratio of an archive (past its first MiB).
    max_archive_ratio: int = 100

    @classmethod
    def for_mailbox(cls, intake: IntakeSettings, mailbox: MailboxSettings) -> Limits:
        return cls(
            max_attachment_bytes=intake.max_attachment_bytes,
            max_mail_bytes=intake.max_mail_bytes,
            max_attachments=intake.max_attachments,
            max_nesting=intake.max_nesting,
            skip_inline_images=mailbox.skip_inline_images,
            min_image_bytes=intake.min_image_bytes,
            max_archive_members=intake.max_archive_members,
            max_archive_bytes=intake.max_archive_bytes,
            max_archive_ratio=intake.max_archive_ratio,
        )

    def archive_budget(self) -> ArchiveBudget:
        """What one mail's archives may expand to."""
        return ArchiveBudget(
            members=self.max_archive_members,
            expanded_bytes=self.max_archive_bytes,
            max_ratio=self.max_archive_ratio,
            max_member_bytes=self.max_attachment_bytes,
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
    #: Why an operator must look at it (a container that could not be opened), else None.
    check_reason: str | None = None
    #: The MIME part it was (IMAP section numbering: ``2.1``); None for a container's files.
    section: str | None = None
    #: Where its body is in the raw mail, for a part refused for its size (left out of the
    #: stored mail: ``storage``); None when it is not there as it is (inside a decoded part).
    removed_span: tuple[int, int] | None = None

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
    #: The display name of the From address, decoded.
    sender_name: str | None = None
    return_path: str | None = None
    authentication_results: str | None = None
    subject: str | None = None
    attachments: list[ParsedAttachment] = field(default_factory=list)
    #: The MIME parts that are the text of the mail or of a mail inside it (sections).
    body_parts: list[str] = field(default_factory=list)
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
    hints = CharsetHints(message)
    _read_headers(parsed, message, hints)
    token, hinted = mime_parts.ELIDED.set(elided), mime_parts.HINTS.set(hints)
    budgeted, raw_set = (
        _BUDGET.set(limits.archive_budget()),
        mime_parts.RAW.set(mime_parts.RawMail(raw)),
    )
    try:
        _collect(message, limits, parsed, parent=None, depth=0, prefix="")
    finally:
        mime_parts.ELIDED.reset(token)
        mime_parts.HINTS.reset(hinted)
        _BUDGET.reset(budgeted)
        mime_parts.RAW.reset(raw_set)
    return parsed


def parse_oversize(header: bytes, size: int | None, limits: Limits) -> ParsedMail:
    """A mail over ``max_mail_bytes`` from its header block alone: headers and the problem.

    Its body is never read, so the mail is known by its header block's hash.
    """
    parsed = ParsedMail(sha256=sha256_hex(header), size=size or len(header))
    told = f"of {size} bytes " if size is not None else ""
    parsed.problem = (
        f"mail {told}exceeds the limit of {limits.max_mail_bytes}: oversize, its body was not read"
    )
    message = email.message_from_bytes(header, policy=policy.compat32)
    _read_headers(parsed, message, CharsetHints(message))
    return parsed


def _header_block(raw: bytes) -> bytes:
    """The header block of ``raw``, up to the first empty line."""
    ends = [cut for cut in (raw.find(b"\r\n\r\n"), raw.find(b"\n\n")) if cut >= 0]
    return raw[: min(ends) + 2] if ends else raw


def _read_headers(parsed: ParsedMail, message: Message, hints: Hints) -> None:
    parsed.message_id = header_text(message, "Message-ID")
    parsed.sender, parsed.sender_name = read_sender(message, hints)
    return_path = header_text(message, "Return-Path")
    parsed.return_path = return_path.strip("<> ") if return_path else None
    parsed.authentication_results = header_text(message, "Authentication-Results", join=True)
    parsed.subject = header_text(message, "Subject", hints=hints)


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


def _collect(
    message: Message,
    limits: Limits,
    parsed: ParsedMail,
    *,
    parent: int | None,
    depth: int,
    prefix: str,
) -> None:
    """Account for every leaf part of ``message``: a file (opened down to the limit) or body.

    ``prefix`` is the section of the ``message/rfc822`` part that holds ``message`` and a dot,
    or "" for the mail itself.
    """
    found = parsed.attachments
    cids = mime_parts.referenced_content_ids(message) if limits.skip_inline_images else set()
    for part, content_type, filename, section in mime_parts.leaf_parts(message, prefix):
        if not mime_parts.is_attachment(part, content_type, filename):
            parsed.body_parts.append(section)
            continue
        nested, decoded = mime_parts.inner_message(part)
        read = read_part(part, mime_parts.ELIDED.get(), limits.max_attachment_bytes)
        if decoded is not None:
            data, size = decoded, None
        elif read is not None:
            data, size = read.data, read.size
        else:
            data, size = mime_parts.payload(part), None
        attachment = _attachment(found, limits, filename, content_type, data, size=size)
        content_id = mime_parts.content_id(part)
        if (
            content_id in cids
            and attachment.skip_reason is None
            and (attachment.file_type in IMAGE_TYPES or attachment.media_type.startswith("image/"))
        ):
            attachment.skip_reason = _INLINE_IMAGE
        attachment.section = section
        if attachment.size > limits.max_attachment_bytes:
            attachment.removed_span = (
                read.span if read and read.span else mime_parts.body_span(part)
            )
        _place(found, attachment, parent)
        _open(parsed, limits, attachment, nested, depth=depth)


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
    elif typing.unreadable is not None:
        attachment.skip_reason = typing.unreadable
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


def _place(
    found: list[ParsedAttachment],
    attachment: ParsedAttachment,
    parent: int | None,
    *,
    folder: str = "",
) -> None:
    attachment.parent = parent
    prefix = f"{found[parent].path}/" if parent is not None else ""
    if folder:
        prefix += clean_text(folder, limit=MAX_PATH_CHARS) + "/"
    attachment.path = (prefix + attachment.name)[:MAX_PATH_CHARS]
    found.append(attachment)


def _open(
    parsed: ParsedMail,
    limits: Limits,
    container: ParsedAttachment,
    nested: Message | None,
    *,
    depth: int,
) -> None:
    """Extract the files of ``container`` when it is one (forwarded mail, winmail.dat).

    A container that cannot be read, or holds no file at all, waits for an operator
    (``check_reason``): it was sent as a document, and nothing of it would reach recognition.
    """
    found = parsed.attachments
    if container.skip_reason and not container.data:
        return  # over a limit: neither stored nor opened
    archive = archive_kind(container.name, container.file_type)
    opened: Opened | None
    if archive is not None:
        if depth >= limits.max_nesting:  # refused before a byte of it is decompressed
            _keep_unopened(container, f"archive ({archive})", limits)
            return
        opened = open_archive(archive, container.data, _budget(limits), mime_parts.HINTS.get()())
    else:
        opened = open_container(container.name, container.media_type, container.data, nested)
    if opened is None:
        return
    container.file_type = opened.file_type
    container.pipeline = None
    if depth >= limits.max_nesting:
        _keep_unopened(container, opened.kind, limits)
        return
    container.skip_reason = None
    if opened.error is not None:
        container.check_reason = f"{opened.kind} could not be opened: {opened.error}"
        return
    position = len(found) - 1
    before = len(found)
    if opened.message is not None:
        section = container.section
        prefix = f"{section}." if section else f"{container.path}:"
        _collect(opened.message, limits, parsed, parent=position, depth=depth + 1, prefix=prefix)
    for item in opened.files:
        inner = _attachment(found, limits, item.name, item.media_type, item.data, size=item.size)
        if item.skip is not None:
            inner.skip_reason = item.skip
        _place(found, inner, position, folder=item.folder)
        _open(parsed, limits, inner, None, depth=depth + 1)
    count = len(found) - before
    container.container_reason = f"{opened.kind}: {count} file{'' if count == 1 else 's'} extracted"
    if count == 0:
        only_text = ", only text" if opened.message is not None else ""
        container.check_reason = f"{opened.kind}: no file inside it{only_text}"


def _keep_unopened(container: ParsedAttachment, kind: str, limits: Limits) -> None:
    container.pipeline = None
    container.skip_reason = f"{kind} nested deeper than {limits.max_nesting} levels: kept unopened"


#: What the archives of the mail being parsed may still expand to.
_BUDGET: ContextVar[ArchiveBudget | None] = ContextVar("budget", default=None)


def _budget(limits: Limits) -> ArchiveBudget:
    budget = _BUDGET.get()
    if budget is None:  # parsing outside parse_mail: a budget of its own
        budget = limits.archive_budget()
        _BUDGET.set(budget)
    return budget
