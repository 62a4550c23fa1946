"""Containers of attachments: forwarded mails and Outlook's winmail.dat (TNEF).

Archives are containers too (``archives``).

A container is stored whole and its files are extracted; ``parsing`` decides
how deep. TNEF is read with ``tnefparse`` after a cheap walk over its framing
that refuses files with absurd object counts (the parser copies the rest of the
file for every object, so a hostile count would cost quadratic time).
"""

from __future__ import annotations

import email
import mimetypes
import struct
from dataclasses import dataclass, field
from email import policy
from email.message import Message

from tnefparse.tnef import TNEF

#: The first four bytes of every TNEF stream (its signature, little-endian).
TNEF_MAGIC = struct.pack("<I", TNEF.TNEF_SIGNATURE)
#: Most objects a winmail.dat may frame; Outlook writes a few dozen per attachment.
MAX_TNEF_OBJECTS = 10_000
_TNEF_MEDIA_TYPES = ("application/ms-tnef", "application/vnd.ms-tnef")
_MAIL_MEDIA_TYPES = ("message/rfc822",)


@dataclass(frozen=True)
class Nested:
    """A file taken out of a container: its name as the container gives it, type, bytes."""

    name: str | None
    media_type: str
    data: bytes
    #: Its folder inside the container (an archive's), "/"-separated, no part that climbs.
    folder: str = ""
    #: Its size when ``data`` was not read (over a limit, encrypted), in bytes.
    size: int | None = None
    #: Why it was not read, when it was not (encrypted, a link).
    skip: str | None = None


@dataclass
class Opened:
    """What a container holds: a mail to walk like the outer one, or files."""

    #: Said in status reasons: "forwarded mail", "winmail.dat (TNEF)".
    kind: str
    #: The container's own file type.
    file_type: str
    message: Message | None = None
    files: list[Nested] = field(default_factory=list)
    #: Why the container could not be read; its files are then not extracted.
    error: str | None = None


def open_container(
    name: str, media_type: str, data: bytes, message: Message | None = None
) -> Opened | None:
    """The contents of a forwarded mail or winmail.dat; None when the file is not one.

    ``message`` is the mail of a ``message/rfc822`` part, already parsed.
    """
    lower = name.lower()
    if message is not None:
        return Opened("forwarded mail", "eml", message=message)
    if media_type in _MAIL_MEDIA_TYPES or lower.endswith(".eml"):
        if not data:
            return None
        return Opened(
            "forwarded mail", "eml", message=email.message_from_bytes(data, policy=policy.compat32)
        )
    if data.startswith(TNEF_MAGIC) or media_type in _TNEF_MEDIA_TYPES or lower == "winmail.dat":
        return _open_tnef(data)
    return None


def _open_tnef(data: bytes) -> Opened:
    opened = Opened("winmail.dat (TNEF)", "tnef")
    try:
        _check_tnef_framing(data)
        tnef = TNEF(data, do_checksum=False)
        for attachment in tnef.attachments:
            name = _tnef_name(attachment)
            media_type = (mimetypes.guess_type(name)[0] if name else None) or (
                "application/octet-stream"
            )
            payload = attachment.data if isinstance(attachment.data, bytes) else b""
            opened.files.append(Nested(name, media_type, payload))
    except Exception as exc:  # any malformed TNEF: the container is kept, unopened
        opened.files = []
        opened.error = f"{type(exc).__name__}: {str(exc)[:200]}"
    return opened


def _check_tnef_framing(data: bytes) -> None:
    """Walk the TNEF objects as tnefparse will; refuse a bad signature or too many objects."""
    if not data.startswith(TNEF_MAGIC):
        raise ValueError("not a TNEF stream (wrong signature)")
    offset, count = 6, 0
    while offset + TNEF.MIN_OBJ_SIZE < len(data):
        (length,) = struct.unpack_from("<I", data, offset + 5)
        offset += min(len(data) - offset, length + 11)
        count += 1
        if count > MAX_TNEF_OBJECTS:
            raise ValueError(f"more than {MAX_TNEF_OBJECTS} TNEF objects")


def _tnef_name(attachment: object) -> str | None:
    for read in ("long_filename", "name"):
        try:
            value = getattr(attachment, read)
            value = value() if callable(value) else value
        except Exception:  # undecodable name: try the next one
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str) and value.strip("\x00 "):
            return value.strip("\x00 ")
    return None
