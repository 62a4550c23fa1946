"""Header text from untrusted mail: encoded words decoded, raw bytes read, controls removed.

RFC 2047 words are decoded with the charset they name, read as the wider charset
mail clients really mean (GB2312 as GB18030, Shift_JIS as CP932); raw 8-bit bytes,
and words whose bytes their charset cannot read, are decoded by ``charsets``
(UTF-8, the mail's declared charsets, detection); bytes no charset explains become
U+FFFD, never another charset's mojibake. Control characters, line separators and
bidi overrides (which disguise names) become spaces, and every value is bounded.
"""

from __future__ import annotations

import re
from email.header import Header, decode_header
from email.message import Message
from email.utils import getaddresses

from mailroom.intake.charsets import Hints, codec_name, decode_unlabelled, no_hints

#: Longest header value kept, in characters.
MAX_HEADER_CHARS = 2000
#: Longest display name kept, in characters.
MAX_NAME_CHARS = 500


def clean_text(value: str, limit: int = MAX_HEADER_CHARS) -> str:
    """Valid UTF-8 text without NUL or other control characters, at most ``limit`` chars.

    Raw 8-bit bytes still carried as surrogate escapes (``decode_words`` reads them first)
    are read as UTF-8; bytes that are not UTF-8 become U+FFFD.
    """
    if not value.isascii():
        if _ESCAPED_BYTE.search(value):
            try:
                value = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            except UnicodeEncodeError:  # a lone surrogate that carries no byte
                pass
        value = value.encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub(" ", value).strip()[:limit]


#: A raw 8-bit byte carried in a str (``surrogateescape``).
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")

#: Control characters (Unicode Cc and Cs), line separators and the bidi overrides
#: (``invoice\u202efdp.exe``) that disguise names.
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def header_text(
    message: Message,
    name: str,
    *,
    join: bool = False,
    hints: Hints = no_hints,
    limit: int = MAX_HEADER_CHARS,
) -> str | None:
    """The decoded, cleaned value of header ``name`` (all of them joined by newlines if ``join``).

    ``hints`` gives the mail's declared charsets, asked only for raw 8-bit or misdeclared text.
    """
    values: list[str] = []
    try:
        values = [decode_words(v, hints) for v in message.get_all(name) or []]
    except Exception:  # malformed header the decoder chokes on: fall back to its raw text
        values = [str(v) for k, v in message.raw_items() if k.lower() == name.lower()]
    values = [clean_text(v, limit) for v in values]
    values = [v for v in values if v]
    if not values:
        return None
    return "\n".join(values)[:limit] if join else values[0]


def decode_words(value: str | Header, hints: Hints = no_hints) -> str:
    """Header text with RFC 2047 encoded words decoded and raw 8-bit bytes read.

    Unknown or wrong charsets never raise: see ``charsets``.
    """
    if isinstance(value, str):
        if not value.isascii() and _ESCAPED_BYTE.search(value):
            # Raw 8-bit text, not encoded words (a mail has one or the other).
            return _raw_text(value, hints)
        if "=?" not in value:
            return value  # no encoded words (``decode_header`` would return it as is)
    out = []
    for chunk, charset in decode_header(value):
        out.append(chunk if isinstance(chunk, str) else _bytes_text(chunk, charset, hints))
    return "".join(out)


def _raw_text(value: str, hints: Hints) -> str:
    """A header the parser read as ASCII with surrogate escapes, as the text it was."""
    try:
        data = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that carries no byte: clean_text drops it
        return value
    return decode_unlabelled(data, hints())


def _bytes_text(data: bytes, charset: str | None, hints: Hints) -> str:
    """Decode one encoded word; bytes its declared charset cannot read are read as raw bytes."""
    codec = codec_name(charset)
    if codec is not None:
        try:
            return data.decode(codec)
        except UnicodeDecodeError:  # the word's charset is wrong: the mail's others, detection
            pass
        except LookupError:
            codec = None
    text = decode_unlabelled(data, [c for c in hints() if c != codec])
    if "\ufffd" in text and codec is not None:
        return data.decode(codec, "replace")  # nothing fits: the sender's word, mended
    return text


def read_sender(message: Message, hints: Hints = no_hints) -> tuple[str | None, str | None]:
    """The addr-spec of From and its display name, decoded; each None when From has none.

    The address is only ever the addr-spec: a display name that reads like an address
    (``=?utf-8?q?ceo@bank.test?= <attacker@evil.test>``) stays the name. A From without
    any address keeps its decoded text as the name.
    """
    name, address = _first_address(message)
    sender = _address_text(address, hints)
    if sender is None and not name:
        return None, header_text(message, "From", hints=hints, limit=MAX_NAME_CHARS)
    display = clean_text(decode_words(name, hints), limit=MAX_NAME_CHARS)
    return sender, display or None


def _address_text(address: str, hints: Hints) -> str | None:
    """``address`` as text when it is an addr-spec; encoded words never make one."""
    address = address.strip()
    if "@" not in address or "=?" in address:
        return None
    return clean_text(decode_words(address, hints)) or None


def _unquoted(phrase: str) -> str:
    """A display name with its quoted strings opened (``"Doe, Jane"`` → ``Doe, Jane``)."""
    opened = _QUOTED.sub(lambda m: _QUOTED_PAIR.sub(r"\1", m.group(1)), phrase)
    return " ".join(opened.split())


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"?', re.S)
_QUOTED_PAIR = re.compile(r"\\(.)", re.S)
#: An RFC 2047 encoded word: it may hold ``@``, ``<`` or ``,`` without being an address.
_ENCODED_WORD = re.compile(r"=\?[^?\s]+\?[bBqQ]\?[^?\s]*\?=")


def _first_address(message: Message) -> tuple[str, str]:
    """The first (name, address) of From, still encoded; ("", "") when there is none.

    The address is split before its name is decoded, so a comma, bracket or ``@`` inside
    an encoded name cannot split it or pass for the address. The header's stored value is
    read: ``get_all`` wraps raw 8-bit text in a Header whose ``str()`` drops the bytes.
    """
    raw = [str(value) for key, value in message.raw_items() if key.lower() == "from"][:1]
    if not raw:
        return "", ""
    angle = _angle_mailbox(raw[0])
    if angle is not None:
        return angle
    try:
        addresses = getaddresses(raw)
    except Exception:  # unparsable address list: no address
        return "", ""
    for name, address in addresses:
        if name or address:
            return name, address
    return "", ""


def _angle_mailbox(value: str) -> tuple[str, str] | None:
    """(phrase, address) of the first mailbox of ``value`` written ``phrase <address>``.

    None when that mailbox is a bare addr-spec (``getaddresses`` reads it then). The
    scan skips quoted strings, comments and encoded words, so none of them can end the
    phrase; a phrase without quotes that holds ``@`` (invalid, but sent) is a phrase still,
    where ``getaddresses`` took it for the address and dropped the real one.
    """
    start, index, depth = 0, 0, 0
    while index < len(value):
        char = value[index]
        if char == "\\" and depth:
            index += 1
        elif depth:
            depth += {"(": 1, ")": -1}.get(char, 0)
        elif char == "(":
            depth = 1
        elif char == '"':
            index += 1
            while index < len(value) and value[index] != '"':
                index += 2 if value[index] == "\\" else 1
        elif char == "=" and (word := _ENCODED_WORD.match(value, index)):
            index = word.end()
            continue
        elif char == ":":
            start = index + 1  # a group's name: its first mailbox follows
        elif char == "<":
            end = value.find(">", index)
            address = value[index + 1 : end if end != -1 else len(value)]
            return _unquoted(value[start:index]), address
        elif char == "," and "@" in value[start:index]:
            return None  # the first mailbox was an addr-spec
        index += 1
    return None
