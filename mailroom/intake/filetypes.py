"""What an attachment is: by its name's extension, its media type, or its bytes.

The name and the Content-Type are the sender's word; when the extension is
unknown, missing or disagrees with the media type, the bytes decide: magic
numbers (``puremagic``) for binary formats, a bounded sniff for CSV/TSV/text.
Executable content is never a document, whatever the name says.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import NamedTuple

import puremagic

#: Longest extension kept in a name or key, in characters.
MAX_EXTENSION_CHARS = 10
#: Bytes of a file read by the magic-number and text sniffs.
SNIFF_BYTES = 64 * 1024
#: Lines of a text sample compared for a consistent delimiter.
SNIFF_LINES = 20

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

#: Types the bytes alone may make a document (plain text needs the name or media type too).
CONTENT_TYPES = frozenset({"csv", "tsv", "xlsx", "xls", "pdf", "png", "jpeg", "tiff"})
#: Image types: inline-image rules apply to them.
IMAGE_TYPES = frozenset({"png", "jpeg", "tiff", "gif", "bmp", "webp", "svg"})
_TEXT_TYPES = frozenset({"csv", "tsv", "txt", "text"})

#: Rules that decide a type, as recorded on the file.
RULE_EXTENSION = "extension"
RULE_MEDIA_TYPE = "media_type"
RULE_CONTENT = "content"

_EXECUTABLE_MAGIC = (
    b"\x7fELF",
    b"\xfe\xed\xfa\xce",  # Mach-O, both word sizes and byte orders, and fat binaries
    b"\xfe\xed\xfa\xcf",
    b"\xce\xfa\xed\xfe",
    b"\xcf\xfa\xed\xfe",
    b"\xca\xfe\xba\xbe",
    b"#!/",  # scripts
)
#: puremagic's extensions of executable formats.
_EXECUTABLE_TYPES = frozenset({"exe", "dll", "msi", "com", "scr", "sys", "elf", "appimage"})
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
#: The stream name an Excel 97-2003 workbook carries in its OLE directory (UTF-16LE).
_XLS_STREAM = "Workbook".encode("utf-16-le")
_ZIP_MAGIC = b"PK\x03\x04"
#: Document formats told by their first bytes alone, before asking puremagic (which tries every
#: signature it knows: about half a millisecond per file, most of intake's parsing time).
_DOCUMENT_MAGIC = (
    (b"%PDF-", "pdf"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)
#: puremagic's extensions → our file types.
_MAGIC_TYPES = {"jfif": "jpeg", "jpe": "jpeg", "jpg": "jpeg", "tif": "tiff", "htm": "html"}


class Typing(NamedTuple):
    """A file's type, its pipeline (None: not a document) and the rule that decided.

    ``unreadable`` says why a file whose name or media type claims a document type is not one
    (its bytes are something else), so the skip reason names what is wrong with the file
    instead of calling a known type unknown.
    """

    file_type: str
    pipeline: str | None
    rule: str
    unreadable: str | None = None


def extension(name: str) -> str:
    """The lower-case extension of ``name``, or "" when it has none worth the name."""
    suffix = PurePosixPath(name).suffix.lower().lstrip(".")
    if not suffix or len(suffix) > MAX_EXTENSION_CHARS or not suffix.isalnum():
        return ""
    return suffix


def classify(name: str, media_type: str, data: bytes = b"") -> Typing:
    """Type ``data`` named ``name`` and sent as ``media_type``; see the module docstring."""
    sniffed = sniff(data)
    if sniffed == "executable":
        return Typing("executable", None, RULE_CONTENT)
    ext = extension(name)
    by_ext = RECOGNIZABLE.get(ext)
    media_ext = MEDIA_EXTENSIONS.get(media_type)
    by_media = RECOGNIZABLE[media_ext] if media_ext else None
    if by_ext and (by_media is None or by_media[0] == by_ext[0]) and _fits(by_ext[0], sniffed):
        return Typing(*by_ext, RULE_EXTENSION)
    # The extension is unknown, missing, disagrees with the media type or with the bytes.
    if by_media and _fits(by_media[0], sniffed):
        return Typing(*by_media, RULE_MEDIA_TYPE)
    if sniffed in CONTENT_TYPES:
        return Typing(*RECOGNIZABLE[sniffed], RULE_CONTENT)
    if by_ext and sniffed == "text" and by_ext[0] in _TEXT_TYPES:
        return Typing(*by_ext, RULE_EXTENSION)
    claimed = by_ext or by_media
    if claimed is not None and sniffed is not None:
        return Typing(claimed[0], None, RULE_CONTENT, _unreadable(claimed[0], sniffed))
    if ext:
        return Typing(ext, None, RULE_EXTENSION)
    if sniffed and sniffed not in ("binary", "text"):
        return Typing(sniffed[:MAX_EXTENSION_CHARS], None, RULE_CONTENT)
    return Typing("unknown", None, RULE_CONTENT if data else RULE_MEDIA_TYPE)


#: What sniffed bytes are, in words, for the reason a claimed document is not one.
_SNIFFED_AS = {
    "zip": "a ZIP archive without a workbook in it (no xl/ part)",
    "ole": "an OLE compound file without an Excel workbook stream",
    "text": "plain text",
    "csv": "comma-separated text",
    "tsv": "tab-separated text",
    "binary": "bytes of no known format",
}


def _unreadable(file_type: str, sniffed: str) -> str:
    """Why bytes sniffed as ``sniffed`` cannot be read as the ``file_type`` they were sent as."""
    found = _SNIFFED_AS.get(sniffed, f"a {sniffed.upper()} file")
    return f"not a readable {file_type.upper()} file: its content is {found}"


def _fits(file_type: str, sniffed: str | None) -> bool:
    """Whether bytes sniffed as ``sniffed`` can be a file of ``file_type``."""
    if sniffed is None:
        return True  # no bytes to contradict the name or media type
    if file_type in _TEXT_TYPES:
        return sniffed in _TEXT_TYPES
    if file_type == "xls":
        return sniffed in ("xls", "ole", "binary")
    # Bytes no magic number identifies (a truncated file) do not contradict the sender.
    return sniffed in (file_type, "binary", "text")


def sniff(data: bytes) -> str | None:
    """What the bytes are: a file type, "text", "binary", or None when there are none."""
    if not data:
        return None
    head = data[:SNIFF_BYTES]
    if head.startswith(_EXECUTABLE_MAGIC) or _is_windows_executable(head):
        return "executable"
    if head.startswith(_OLE_MAGIC):
        return "xls" if _XLS_STREAM in data else "ole"
    if head.startswith(_ZIP_MAGIC):
        # The central directory at the end names the parts; OOXML workbooks keep theirs in xl/.
        return "xlsx" if b"xl/" in head or b"xl/" in data[-SNIFF_BYTES:] else "zip"
    for prefix, file_type in _DOCUMENT_MAGIC:
        if head.startswith(prefix):
            return file_type
    text = _text_kind(head, truncated=len(data) > len(head))
    if text in ("csv", "tsv"):
        # Lines with one delimiter count throughout are a table, whatever magic number
        # their first letters happen to spell.
        return text
    magic = _magic(head)
    if magic in _EXECUTABLE_TYPES:
        # Two letters ("MZ") are all some of these signatures check: text is not a program.
        return text or "executable"
    if magic and magic != "txt":
        return magic
    return text or "binary"


def _is_windows_executable(head: bytes) -> bool:
    """A PE file (its header offset at 0x3C) or a DOS program with the usual stub text."""
    if not head.startswith(b"MZ") or len(head) < 64:
        return False
    offset = int.from_bytes(head[0x3C:0x40], "little")
    return head[offset : offset + 4] == b"PE\x00\x00" or b"DOS mode" in head[:512]


def _magic(head: bytes) -> str:
    try:
        matches = puremagic.magic_string(head)
    except (puremagic.PureError, ValueError):
        return ""
    if not matches:
        return ""
    extension: str = matches[0].extension  # puremagic's result is an untyped namedtuple
    found = extension.lower().lstrip(".")
    return _MAGIC_TYPES.get(found, found)


def _text_kind(head: bytes, *, truncated: bool) -> str | None:
    """ "csv", "tsv" or "text" for a text sample, None for binary."""
    if b"\x00" in head:
        return None
    text = head.removeprefix(b"\xef\xbb\xbf").decode("utf-8", "replace")
    if truncated:
        text = text.rsplit("\n", 1)[0]  # the last line may be cut
    controls = sum(1 for c in text if c < " " and c not in "\t\r\n\f")
    if text.count("\ufffd") + controls > len(text) // 20:
        return None  # not UTF-8 text, nor a one-byte charset with a few accents
    if text.lstrip().startswith("<"):
        return "text"  # markup, never a table
    lines = [line for line in text.splitlines() if line.strip()][:SNIFF_LINES]
    for delimiter, kind in (("\t", "tsv"), (",", "csv"), (";", "csv")):
        counts = {line.count(delimiter) for line in lines}
        if len(counts) == 1 and counts != {0}:
            return kind
    return "text"
