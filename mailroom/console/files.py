"""A file as the console shows it: a table (CSV, TSV, XLSX), inline (PDF, images) or a download.

Bytes come only through the object store and only from the configured buckets: a row
naming any other bucket is refused, whatever wrote it. What is served inline is a
short list of types a browser shows without running anything; the rest goes out as
``application/octet-stream`` with ``attachment``, never sniffed (``nosniff``).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.settings import StorageSettings

Preview = Literal["table", "text", "pdf", "image", "download", "none"]

#: Types shown inline, with the media type they are served as.
INLINE_TYPES = {
    "pdf": "application/pdf",
    "png": "image/png",
    "jpeg": "image/jpeg",
    "jpg": "image/jpeg",
    "gif": "image/gif",
}
TABLE_TYPES = frozenset({"csv", "tsv", "xlsx"})
#: Longest cell shown, in characters.
MAX_CELL_CHARS = 500
#: Most columns shown of a row.
MAX_COLUMNS = 50


@dataclass(frozen=True)
class FileObject:
    file_id: int
    name: str
    file_type: str
    bucket: str | None
    key: str | None
    size: int | None


async def file_object(session: AsyncSession, file_id: int) -> FileObject | None:
    row = (
        await session.execute(
            text(
                """SELECT f.id, f.original_name, f.file_type, o.bucket, o.key,
                          COALESCE(o.size, f.size) AS size
                     FROM stored_file AS f LEFT JOIN stored_object AS o ON o.id = f.object_id
                    WHERE f.id = :id"""
            ),
            {"id": file_id},
        )
    ).first()
    if row is None:
        return None
    return FileObject(row.id, row.original_name, row.file_type, row.bucket, row.key, row.size)


def servable(found: FileObject, storage: StorageSettings) -> bool:
    """Is the file's object in one of the configured buckets?"""
    buckets = {storage.mail_bucket, storage.incoming_bucket, storage.results_bucket}
    return found.bucket is not None and found.key is not None and found.bucket in buckets


def preview_of(found: FileObject, max_table_bytes: int) -> Preview:
    kind = found.file_type.lower()
    if kind in INLINE_TYPES:
        return "image" if kind != "pdf" else "pdf"
    # Unknown sizes are checked against the store before the bytes are read.
    small = found.size is None or found.size <= max_table_bytes
    if kind in TABLE_TYPES and small:
        return "table"
    if kind == "txt" and small:
        return "text"
    return "download"


def media_type_of(found: FileObject) -> str:
    return INLINE_TYPES.get(found.file_type.lower(), "application/octet-stream")


def disposition(found: FileObject) -> str:
    """``inline`` for the types shown in the page, else ``attachment``; the name RFC 5987-quoted."""
    how = "inline" if found.file_type.lower() in INLINE_TYPES else "attachment"
    return f"{how}; filename*=UTF-8''{quote(found.name, safe='')}"


def table_rows(data: bytes, file_type: str, max_rows: int) -> list[list[str]]:
    """The first ``max_rows`` rows of a CSV, TSV or XLSX file, as text cells."""
    if file_type.lower() == "xlsx":
        return _sheet_rows(data, max_rows)
    decoded = data.decode("utf-8-sig", errors="replace")
    if file_type.lower() == "tsv":
        dialect: type[csv.Dialect] | csv.Dialect = csv.excel_tab
    else:
        try:
            dialect = csv.Sniffer().sniff(decoded[:4096], delimiters=",;\t|")
        except csv.Error:
            dialect = csv.excel
    rows = []
    for row in csv.reader(io.StringIO(decoded), dialect):
        rows.append([_cell(value) for value in row[:MAX_COLUMNS]])
        if len(rows) >= max_rows:
            break
    return rows


def _sheet_rows(data: bytes, max_rows: int) -> list[list[str]]:
    from openpyxl import load_workbook

    workbook = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        sheet = workbook.worksheets[0]
        rows = []
        for row in sheet.iter_rows(max_row=max_rows, values_only=True):
            rows.append(["" if v is None else _cell(str(v)) for v in row[:MAX_COLUMNS]])
        return rows
    finally:
        workbook.close()


def _cell(value: str) -> str:
    return value if len(value) <= MAX_CELL_CHARS else value[: MAX_CELL_CHARS - 1] + "…"
