"""The mail as it is stored: without the bodies of the parts refused for their size.

A part over ``max_attachment_bytes`` is recorded but never stored as a file; left in the
``.eml``, it would be stored after all, counted by retention and copied by every backup.
So its body is cut out of the stored mail and a header in the part says what was removed:
how many bytes and their SHA-256, enough to match it against the mail on the server. The
rest of the mail stays byte for byte as received; ``inbound_mail.content_sha256`` is the
hash of the mail as received, the object's key and hash those of the bytes stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from mailroom.intake.parsing import ParsedAttachment

#: The header put into a part whose body was removed from the stored mail.
REMOVED_HEADER = "X-Mailroom-Removed"


def stored_mail(raw: bytes, attachments: Iterable[ParsedAttachment]) -> bytes | None:
    """``raw`` without the bodies of the parts refused for their size; None if there are none."""
    spans = sorted(a.removed_span for a in attachments if a.removed_span is not None)
    if not spans:
        return None
    pieces: list[bytes] = []
    before = 0
    for start, end in spans:
        if start < before:  # inside a body removed already
            continue
        # The removed text is the body without its line ends; what follows them is the next
        # boundary, which keeps one line end before it.
        while end > start and raw[end - 1 : end] in (b"\r", b"\n"):
            end -= 1
        after = end
        while raw[after : after + 1] in (b"\r", b"\n"):
            after += 1
        digest = hashlib.sha256(memoryview(raw)[start:end]).hexdigest()
        marker = (
            f"{REMOVED_HEADER}: body of {end - start} bytes over the attachment limit; "
            f"sha256={digest}"
        ).encode()
        newline = _newline(raw, after)
        header_end = _header_end(raw, start)
        if header_end is None:  # no header block right before the body: the marker is the body
            pieces += [raw[before:start], marker, newline]
        else:  # the part keeps its headers and the marker, and no body at all
            pieces += [raw[before:header_end], marker, newline, newline]
        before = after
    pieces.append(raw[before:])
    return b"".join(pieces)


def _header_end(raw: bytes, body_start: int) -> int | None:
    """Where the empty line that ends the part's headers starts, when it is right before."""
    for blank in (b"\r\n\r\n", b"\n\n"):
        if raw[max(0, body_start - len(blank)) : body_start] == blank:
            return body_start - len(blank) // 2
    return None


def _newline(raw: bytes, at: int) -> bytes:
    """The line end used just before ``at``."""
    return b"\r\n" if raw[max(0, at - 2) : at] == b"\r\n" else b"\n"
