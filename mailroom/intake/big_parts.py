"""Big part bodies kept away from the ``email`` parser, which would hold each several times.

The parser splits a body into lines, joins them again, and decoding copies once more: a
30 MB attachment took hundreds of MiB. So before a big mail is parsed, each long run of
base64-looking lines (the body of a big part) is cut out of the text the parser sees and
replaced by a one-line marker. The part is then read from the raw bytes: its size from the
base64 length, and it is decoded only when it is under the attachment limit. A marker found
anywhere else (a text body that looked like base64) is put back before the part is read.
"""

from __future__ import annotations

import binascii
import re
import secrets
from dataclasses import dataclass
from email.message import Message
from typing import NamedTuple

#: Mails smaller than this are parsed as they are, in bytes.
MIN_MAIL_BYTES = 1024 * 1024
#: Runs of base64-looking text shorter than this stay in the text the parser sees, in bytes.
MIN_RUN_BYTES = 128 * 1024
#: How much of a skipped part's start is decoded for its type (magic numbers), in base64 bytes.
HEAD_BYTES = 64 * 1024

_ALPHABET = rb"A-Za-z0-9+/=\r\n"
# The lookbehind makes each run start where the text before it stops looking like base64, so
# every position is looked at once (a plain ``{N,}`` would rescan each short run N times).
_RUN = re.compile(rb"(?<![%s])[%s]{%d,}" % (_ALPHABET, _ALPHABET, MIN_RUN_BYTES))


@dataclass(frozen=True)
class ElidedMail:
    """A big mail's raw bytes, the text the parser sees, and where each cut-out run was."""

    raw: bytes
    #: ``raw`` with each run replaced by ``marker`` and its number, on a line of its own.
    text: bytes
    marker: str
    spans: tuple[tuple[int, int], ...]

    def span_of(self, payload: str) -> tuple[int, int] | None:
        """The run a part's undecoded payload stands for, when it is one marker and nothing else."""
        body = payload.strip()
        if not body.startswith(self.marker):
            return None
        number = body[len(self.marker) :]
        if not number.isdigit() or int(number) >= len(self.spans):
            return None
        return self.spans[int(number)]

    def restore(self, payload: str) -> str:
        """``payload`` with every marker replaced by the text it stands for."""
        pattern = re.compile(re.escape(self.marker) + r"(\d+)")
        return pattern.sub(lambda m: self._text(int(m.group(1))), payload)

    def restore_part(self, part: Message) -> None:
        """Put back the text of any marker in the undecoded payload of the leaf ``part``."""
        payload = part.get_payload()
        if isinstance(payload, str) and self.marker in payload:
            part.set_payload(self.restore(payload))

    def restore_bytes(self, data: bytes) -> bytes:
        if self.marker.encode() not in data:
            return data
        text = self.restore(data.decode("ascii", "surrogateescape"))
        return text.encode("ascii", "surrogateescape")

    def _text(self, number: int) -> str:
        if number >= len(self.spans):
            return f"{self.marker}{number}"
        start, end = self.spans[number]
        return self.raw[start:end].decode("ascii").rstrip("\r\n")


def elide_big_bodies(raw: bytes) -> ElidedMail | None:
    """``raw`` with its big base64-looking runs cut out, or None when it has none."""
    if len(raw) < MIN_MAIL_BYTES:
        return None
    spans = [span for match in _RUN.finditer(raw) if (span := _whole_lines(raw, *match.span()))]
    if not spans:
        return None
    marker = f"MAILROOM{secrets.token_hex(8)}ELIDED"
    pieces: list[bytes] = []
    before = 0
    for number, (start, end) in enumerate(spans):
        newline = b"\r\n" if raw[end - 2 : end] == b"\r\n" else b"\n"
        pieces += [raw[before:start], f"{marker}{number}".encode(), newline]
        before = end
    pieces.append(raw[before:])
    return ElidedMail(raw, b"".join(pieces), marker, tuple(spans))


def _whole_lines(raw: bytes, start: int, end: int) -> tuple[int, int] | None:
    """The whole, non-empty lines of ``raw[start:end]``; None when too little is left.

    A run starts after a character that is not base64 (a header, a boundary), so its first
    line is cut off unless it starts the mail; empty lines at its start end a header block.
    """
    if start > 0:
        start = raw.find(b"\n", start, end) + 1
        if start == 0:
            return None
    while start < end and raw[start : start + 1] in (b"\r", b"\n"):
        start += 1
    if end < len(raw):
        end = raw.rfind(b"\n", start, end) + 1
    if end - start < MIN_RUN_BYTES:
        return None
    return start, end


def base64_size(raw: bytes, span: tuple[int, int]) -> int:
    """The decoded size of the base64 text ``raw[span]``, without decoding it."""
    start, end = span
    chars = end - start - raw.count(b"\n", start, end) - raw.count(b"\r", start, end)
    tail = raw[max(start, end - 8) : end].rstrip(b"\r\n")
    padding = len(tail) - len(tail.rstrip(b"="))
    return max(0, chars * 3 // 4 - padding)


def decode_base64(raw: bytes, span: tuple[int, int]) -> bytes | None:
    """The bytes of the base64 text ``raw[span]``; None when it is broken (bad padding)."""
    start, end = span
    try:
        return binascii.a2b_base64(memoryview(raw)[start:end])
    except binascii.Error:
        return None


def decode_head(raw: bytes, span: tuple[int, int]) -> bytes:
    """The first bytes of the base64 text ``raw[span]``, enough to tell its type."""
    start, end = span
    return _decode_start(raw[start : min(end, start + HEAD_BYTES)])


def _decode_start(text: bytes) -> bytes:
    chars = text.translate(None, _SPACE)
    try:
        return binascii.a2b_base64(chars[: len(chars) // 4 * 4])
    except binascii.Error:
        return b""


#: Bytes a base64 text may carry between its characters.
_SPACE = b" \t\r\n"


class PartRead(NamedTuple):
    """A part's bytes (only their start when over the limit), its size, and where its body is."""

    data: bytes
    size: int
    #: The part's base64 body in the raw mail, when it was cut out of the parser's text.
    span: tuple[int, int] | None = None


def read_part(part: Message, elided: ElidedMail | None, max_bytes: int) -> PartRead | None:
    """A base64 leaf part over ``max_bytes``, or one cut out of the parser's text.

    Over ``max_bytes`` the bytes are only its start (for its type) and the size is told by
    the base64 length: it is never decoded whole. A cut-out part under it is decoded from the
    raw mail. None otherwise (a marker in the part is then put back): read it as usual.
    """
    payload = part.get_payload()
    if not isinstance(payload, str):
        return None
    encoding = str(part.get("Content-Transfer-Encoding", "")).strip().lower()
    if elided is not None and elided.marker in payload:
        span = elided.span_of(payload)
        if span is not None and encoding == "base64":
            size = base64_size(elided.raw, span)
            if size > max_bytes:
                return PartRead(decode_head(elided.raw, span), size, span)
            data = decode_base64(elided.raw, span)
            if data is not None:
                return PartRead(data, len(data), span)
        payload = elided.restore(payload)
        part.set_payload(payload)
    if encoding == "base64" and len(payload) * 3 // 4 > max_bytes:
        text = payload.encode("ascii", "ignore")
        tail = text[-8:].rstrip()
        padding = len(tail) - len(tail.rstrip(b"="))
        size = (len(text) - sum(text.count(c) for c in _SPACE)) * 3 // 4 - padding
        if size > max_bytes:
            return PartRead(_decode_start(text[:HEAD_BYTES]), size)
    return None
