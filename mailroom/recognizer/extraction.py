"""Field extraction of the reference recognizer: CSV / TSV / XLSX / plain text → fields.

Pure functions over bytes. A table is read in one of two layouts: a header row
with its first data row (``invoice_number,total`` / ``A-1,10.50``), or key/value
columns (two columns, the key in the first). Plain text is read as ``Key: Value``
lines. Field names are normalised to lower snake case; each value gets a
confidence: high for clean values, low for values that look garbled.
"""

from __future__ import annotations

import csv
import io
import re
import unicodedata
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

from mailroom.errors import EmptyFile, UnreadableFile, UnsupportedType
from mailroom.recognition.contract.models import ResultField

#: Confidence of a value that reads cleanly.
CLEAN_CONFIDENCE = 0.99
#: Confidence of a value that is empty or looks garbled.
GARBLED_CONFIDENCE = 0.5
#: Rows and columns read from one table at most; the rest is ignored.
MAX_ROWS = 10_000
MAX_COLUMNS = 200
#: Longest field value kept, in characters.
MAX_VALUE_CHARS = 2_000

TABULAR_TYPES = frozenset({"csv", "tsv", "xlsx", "xlsm"})
TEXT_TYPES = frozenset({"txt", "text"})
IMAGE_TYPES = frozenset({"pdf", "png", "jpeg", "jpg", "tiff", "tif"})

#: A document type is guessed from a field only it carries.
_TYPE_MARKERS = {"invoice_number": "invoice"}
_SPREADSHEET_ERRORS = frozenset(
    {"#N/A", "#VALUE!", "#REF!", "#DIV/0!", "#NAME?", "#NUM!", "#NULL!", "N/A"}
)
_KEY_VALUE_HEADERS = frozenset(
    {("key", "value"), ("field", "value"), ("name", "value"), ("field", "val")}
)
_NUMBER = re.compile(r"^[-+]?\d[\d\s.,']*$")


@dataclass(frozen=True)
class Extraction:
    """What one file yielded: a document type guess and its fields."""

    document_type: str
    fields: dict[str, ResultField]


def extract(data: bytes, file_type: str) -> Extraction:
    """Extract fields from ``data`` read as ``file_type`` (``csv``, ``xlsx``, ``png``…).

    Images yield no fields unless their bytes are plain text (a reference service
    does no OCR).

    Raises:
        ExtractionError: ``UNREADABLE``, ``EMPTY`` or ``UNSUPPORTED_TYPE``.
    """
    kind = file_type.lower().lstrip(".")
    if not data:
        raise EmptyFile(f"the {kind or 'unknown'} file is empty")
    if kind in ("csv", "tsv"):
        return _from_pairs(read_table_pairs(_rows_from_delimited(data, kind)))
    if kind in ("xlsx", "xlsm"):
        return _from_pairs(read_table_pairs(_rows_from_xlsx(data)))
    if kind in TEXT_TYPES:
        return _from_pairs(read_text_pairs(decode_text(data)))
    if kind in IMAGE_TYPES:
        if looks_like_text(data):
            return _from_pairs(read_text_pairs(decode_text(data)))
        return Extraction(document_type="generic", fields={})
    raise UnsupportedType(f"file type {kind[:20]!r} is not supported")


def normalise_name(name: str) -> str:
    """Lower snake case: ``Invoice Number`` / ``InvoiceNumber`` → ``invoice_number``."""
    ascii_name = (
        unicodedata.normalize("NFKD", name.replace("ß", "ss"))
        .encode("ascii", "ignore")
        .decode("ascii")
        .strip()
    )
    split = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", ascii_name)
    return re.sub(r"[^0-9a-zA-Z]+", "_", split).strip("_").lower()[:100]


def score_value(raw: Any) -> ResultField:
    """A field value and its confidence; empty and garbled values score low."""
    value = _plain_value(raw)
    if value is None:
        return ResultField(value=None, confidence=GARBLED_CONFIDENCE)
    if isinstance(value, str) and _looks_garbled(value):
        return ResultField(value=value, confidence=GARBLED_CONFIDENCE)
    return ResultField(value=value, confidence=CLEAN_CONFIDENCE)


def guess_document_type(fields: Iterable[str]) -> str:
    names = set(fields)
    for marker, document_type in _TYPE_MARKERS.items():
        if marker in names:
            return document_type
    return "generic"


def decode_text(data: bytes) -> str:
    """Text from UTF-8 (BOM optional) or BOM-marked UTF-16 bytes."""
    if b"\x00" in data and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise UnreadableFile("binary data where text was expected")
    try:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"not valid UTF-8 text: {exc.reason}") from exc


def looks_like_text(data: bytes) -> bool:
    """Whether ``data`` decodes as text with no control characters besides whitespace."""
    try:
        text = decode_text(data)
    except UnreadableFile:
        return False
    return not any(unicodedata.category(c) == "Cc" and c not in "\t\r\n\f" for c in text)


def read_text_pairs(text: str) -> list[tuple[str, Any]]:
    """``Key: Value`` lines; lines without a colon are not fields."""
    if not text.strip():
        raise EmptyFile("the text holds no data")
    pairs = []
    for line in text.splitlines()[:MAX_ROWS]:
        key, colon, value = line.partition(":")
        if colon and key.strip():
            pairs.append((key, value))
    return pairs


def read_table_pairs(rows: Sequence[Sequence[Any]]) -> list[tuple[str, Any]]:
    """(name, value) pairs of a table in header layout or key/value layout."""
    table = [row for row in (_trim(row) for row in rows) if row]
    if not table:
        raise EmptyFile("the table holds no data")
    width = max(len(row) for row in table)
    first = table[0]
    if width <= 2:
        header = tuple(normalise_name(str(cell)) for cell in first)
        if header in _KEY_VALUE_HEADERS:
            return _key_value_pairs(table[1:])
        if len(table) != 2 or _looks_like_values(first):
            return _key_value_pairs(table)
    values = table[1] if len(table) > 1 else []
    return [
        (str(name), values[i] if i < len(values) else None)
        for i, name in enumerate(first)
        if not _is_empty(name)
    ]


def _key_value_pairs(rows: Sequence[Sequence[Any]]) -> list[tuple[str, Any]]:
    return [
        (str(row[0]), row[1] if len(row) > 1 else None) for row in rows if not _is_empty(row[0])
    ]


def _looks_like_values(row: Sequence[Any]) -> bool:
    # A header row holds names; a number or an empty cell in it means the row is data.
    return any(_is_empty(cell) or not isinstance(cell, str) or _NUMBER.match(cell) for cell in row)


def _from_pairs(pairs: Iterable[tuple[str, Any]]) -> Extraction:
    fields: dict[str, ResultField] = {}
    for raw_name, raw_value in pairs:
        name = normalise_name(raw_name)
        if not name:
            continue
        unique, n = name, 2
        while unique in fields:
            unique, n = f"{name}_{n}", n + 1
        fields[unique] = score_value(raw_value)
    return Extraction(document_type=guess_document_type(fields), fields=fields)


def _rows_from_delimited(data: bytes, kind: str) -> list[list[str]]:
    text = decode_text(data)
    if not text.strip():
        raise EmptyFile(f"the {kind} file holds no data")
    delimiter = "\t" if kind == "tsv" else _guess_delimiter(text)
    try:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
        return [row[:MAX_COLUMNS] for _, row in zip(range(MAX_ROWS), reader, strict=False)]
    except csv.Error as exc:
        raise UnreadableFile(f"not valid {kind}: {exc}") from exc


def _guess_delimiter(text: str) -> str:
    first_line = next((line for line in text.splitlines() if line.strip()), "")
    counts = {d: first_line.count(d) for d in (",", ";", "\t", "|")}
    best = max(counts, key=lambda d: counts[d])
    return best if counts[best] else ","


def _rows_from_xlsx(data: bytes) -> list[list[Any]]:
    from openpyxl import load_workbook
    from openpyxl.utils.exceptions import InvalidFileException

    try:
        workbook = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except (zipfile.BadZipFile, InvalidFileException, KeyError, ValueError, OSError) as exc:
        raise UnreadableFile(f"not a readable xlsx workbook: {type(exc).__name__}") from exc
    except Exception as exc:
        # openpyxl fails on malformed parts in many ways (TypeError, parser errors…);
        # any of them means the same to the sender: the workbook cannot be read.
        raise UnreadableFile(f"malformed xlsx workbook: {type(exc).__name__}") from exc
    try:
        for sheet in workbook.worksheets:
            rows = [
                list(row[:MAX_COLUMNS])
                for _, row in zip(range(MAX_ROWS), sheet.iter_rows(values_only=True), strict=False)
            ]
            if any(_trim(row) for row in rows):
                return rows
        return []
    except Exception as exc:  # malformed sheet parts, as above
        raise UnreadableFile(f"malformed xlsx workbook: {type(exc).__name__}") from exc
    finally:
        workbook.close()


def _trim(row: Sequence[Any]) -> list[Any]:
    cells = list(row)
    while cells and _is_empty(cells[-1]):
        cells.pop()
    return cells


def _is_empty(cell: Any) -> bool:
    return cell is None or (isinstance(cell, str) and not cell.strip())


def _plain_value(raw: Any) -> str | int | float | bool | None:
    if _is_empty(raw):
        return None
    if isinstance(raw, bool | int | float):
        return raw
    if isinstance(raw, datetime | date | time):
        return raw.isoformat()
    return str(raw).strip()[:MAX_VALUE_CHARS]


def _looks_garbled(value: str) -> bool:
    if set(value) <= {"?"} or value.upper() in _SPREADSHEET_ERRORS:
        return True
    return "\ufffd" in value or any(unicodedata.category(c) == "Cc" for c in value)
