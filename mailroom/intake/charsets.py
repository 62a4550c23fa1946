"""Text from bytes whose charset is unknown or wrong: UTF-8, the mail's own charsets, detection.

Mail headers should be ASCII, but clients write raw 8-bit bytes in the sender's
local charset, and RFC 2047 words sometimes name a charset their bytes are not
in. Valid UTF-8 is taken as it is (other charsets rarely make valid UTF-8 of
real text). Otherwise the charsets the mail declares elsewhere (its parts'
``charset`` parameters, its encoded words' charsets) are the hints:
``charset-normalizer`` decides among them, then, for a text long enough to
tell, among the charsets mail is commonly written in. Detectors cannot tell a
few bytes apart reliably, which is why the mail's own word counts first. The charset found is read as the wider
one clients mean (GB2312 and GBK as GB18030, Shift_JIS as CP932); bytes nothing
explains become U+FFFD, never another charset's mojibake.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable, Iterable
from email.message import Message

from charset_normalizer import from_bytes

#: Charsets mail clients declare for a wider one they actually use (WHATWG Encoding), by
#: Python codec name.
SUPERSETS = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "hz": "gb18030",
    "big5": "big5hkscs",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "iso8859-1": "cp1252",
    "latin-1": "cp1252",
    "tis-620": "cp874",
}
#: Fewest 8-bit bytes a text needs before a charset is guessed for it without a hint: a few
#: bytes fit many charsets equally well (a two-character GBK name is valid Big5 too).
MIN_DETECT_BYTES = 12
#: Characters UTF-8 must read for each byte it cannot before a text counts as UTF-8.
UTF8_GOOD_PER_BAD = 4
#: Charsets raw header bytes are commonly written in, for mails that declare none that fit.
COMMON = (
    "gb18030",
    "big5hkscs",
    "cp932",
    "euc_jp",
    "cp949",
    "koi8_r",
    "cp1251",
    "cp1252",
    "iso8859_2",
    "cp1250",
    "iso8859_7",
    "cp1253",
    "iso8859_9",
    "cp1254",
    "cp1255",
    "cp1256",
    "cp874",
)
#: Names mail clients use that Python does not know.
_ALIASES = {
    "x-gbk": "gbk",
    "x-x-big5": "big5",
    "x-sjis": "shift_jis",
    "ks_c_5601-1987": "cp949",
    "windows-874": "cp874",
}
#: The charset of an RFC 2047 encoded word, up to its language suffix or ``?``.
_WORD_CHARSET = re.compile(r"=\?([A-Za-z0-9_.:+-]{1,40})(?:\*[^?]*)?\?[BbQq]\?")


def codec_name(charset: str | None) -> str | None:
    """Python's codec for ``charset``, widened to the superset clients mean.

    None when the name is unknown or says nothing about 8-bit bytes (US-ASCII).
    """
    if not charset:
        return None
    name = charset.split("*", 1)[0].strip().strip('"').lower()  # RFC 2231 suffix: utf-8*en
    try:
        codec = codecs.lookup(_ALIASES.get(name, name)).name
    except (LookupError, ValueError):
        return None
    if codec == "ascii":
        return None
    return SUPERSETS.get(codec, codec)


def decode_unlabelled(data: bytes, hints: Iterable[str] = ()) -> str:
    """``data`` as text: UTF-8, else a hinted charset, else a common one that fits."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    as_utf8 = data.decode("utf-8", "replace")
    if _mostly_utf8(as_utf8):
        return as_utf8  # UTF-8 with a stray byte: other charsets would misread all the rest
    hinted = _unique(hints)
    if hinted and (found := _detect(data, hinted)) is not None:
        return found
    if _high_bytes(data) >= MIN_DETECT_BYTES and (found := _detect(data, COMMON)) is not None:
        return found
    return data.decode("utf-8", "replace")


def _mostly_utf8(text: str) -> bool:
    """Whether UTF-8 read the text's 8-bit bytes, all but a few (``UTF8_GOOD_PER_BAD``).

    Text in another charset has more bytes UTF-8 cannot read than sequences it can (GBK
    text: about two bad for each good one), so many good sequences per bad one mean UTF-8.
    """
    bad = text.count("\ufffd")
    good = sum(1 for char in text if char > "\x7f") - bad
    return good >= UTF8_GOOD_PER_BAD * max(bad, 1)


def _high_bytes(data: bytes) -> int:
    return len(data) - len(data.translate(None, _HIGH))


_HIGH = bytes(range(0x80, 0x100))


def _unique(hints: Iterable[str]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for hint in hints:
        codec = codec_name(hint)
        if codec is not None and codec != "utf-8":
            seen.setdefault(codec)
    return tuple(seen)


def _detect(data: bytes, candidates: tuple[str, ...]) -> str | None:
    """The text of ``data`` in the candidate that reads it best, or None when none fits."""
    best = from_bytes(data, cp_isolation=list(candidates)).best()
    if best is None:
        return None
    codec = codec_name(best.encoding) or best.encoding
    try:
        return data.decode(codec)
    except (UnicodeDecodeError, LookupError):
        return str(best)


class CharsetHints:
    """The charsets a mail declares (parts' ``charset``, encoded words), read once when asked.

    Raw 8-bit headers are rare, so most mails never pay for the walk.
    """

    def __init__(self, message: Message) -> None:
        self._message = message
        self._found: list[str] | None = None

    def __call__(self) -> list[str]:
        if self._found is None:
            self._found = list(_unique(self._declared()))
        return self._found

    def _declared(self) -> Iterable[str]:
        for _, value in self._message.raw_items():
            if isinstance(value, str) and "=?" in value:
                yield from _WORD_CHARSET.findall(value)
        for part in self._message.walk():
            try:
                charset = part.get_param("charset")
            except Exception:  # malformed Content-Type parameters: no hint from this part
                continue
            if isinstance(charset, str):
                yield charset


#: Something that gives a mail's charset hints when asked (``CharsetHints``).
Hints = Callable[[], list[str]]


def no_hints() -> list[str]:
    return []
