"""Header text from untrusted mail: encoded words decoded, raw bytes read, controls removed.

RFC 2047 words are decoded with the charset they name, read as the wider charset
mail clients really mean (GB2312 as GB18030, Shift_JIS as CP932); raw 8-bit bytes
are read as UTF-8; bytes no charset explains become U+FFFD, never Latin-1
mojibake. Control characters, line separators and bidi overrides (which disguise
names) become spaces, and every value is bounded.
"""

from __future__ import annotations

import re
from email.header import Header, decode_header
from email.message import Message
from email.utils import getaddresses

#: Longest header value kept, in characters.
MAX_HEADER_CHARS = 2000


def clean_text(value: str, limit: int = MAX_HEADER_CHARS) -> str:
    """Valid UTF-8 text without NUL or other control characters, at most ``limit`` chars.

    Raw 8-bit header bytes arrive as surrogate escapes; they are read as UTF-8, and
    bytes that are not UTF-8 become U+FFFD: no charset is declared for them, and a
    guess (Latin-1) turns every other charset into mojibake.
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


def header_text(message: Message, name: str, *, join: bool = False) -> str | None:
    """The decoded, cleaned value of header ``name`` (all of them joined by newlines if ``join``)."""
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
    """Decode one encoded word; bytes its charset cannot explain become U+FFFD."""
    codec = _codec(charset)
    if codec is not None:
        try:
            return data.decode(codec, "replace")
        except LookupError:  # a charset Python does not know
            pass
    return data.decode("utf-8", "replace")


#: Charsets mail clients declare for a wider one they actually use (WHATWG Encoding).
_CHARSET_SUPERSETS = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "x-gbk": "gb18030",
    "cp936": "gb18030",
    "big5": "big5hkscs",
    "x-x-big5": "big5hkscs",
    "shift_jis": "cp932",
    "shift-jis": "cp932",
    "sjis": "cp932",
    "x-sjis": "cp932",
    "ks_c_5601-1987": "cp949",
    "euc-kr": "cp949",
    "iso-8859-1": "cp1252",
    "latin1": "cp1252",
    "us-ascii": "cp1252",
    "tis-620": "cp874",
}


def _codec(charset: str | None) -> str | None:
    if not charset:
        return None
    name = charset.split("*", 1)[0].strip().lower()  # RFC 2231 language suffix: utf-8*en
    if name in ("", "unknown-8bit", "x-unknown", "unknown"):
        return None
    return _CHARSET_SUPERSETS.get(name, name)


def sender_address(message: Message) -> str | None:
    """The From address, or the decoded header text when it holds no address."""
    sender = header_text(message, "From")
    if sender is None:
        return None
    try:
        addresses = getaddresses([sender])
    except Exception:  # unparsable address list: the decoded header text is kept instead
        addresses = []
    if addresses and "@" in addresses[0][1]:
        return clean_text(addresses[0][1])
    return sender
