"""Archives opened like forwarded mails: ``.zip``, ``.tar`` and compressed tars, within limits.

An archive is untrusted twice over: its names may climb out of any folder
(``../../etc/passwd``) and its sizes may lie (a zip bomb expands a few kilobytes
to gigabytes). So names keep only their clean folder parts, and every limit is
checked before decompressing (member count, declared sizes, declared ratio) and
again while decompressing (actual bytes against the declared ones, the mail's
budget and the ratio), reading in chunks so a lying header never costs more
than one chunk past a limit. An archive over a limit yields no files at all;
the caller keeps it whole for an operator. Encrypted members are listed, never
read. ``.7z`` is not opened (it stays a SKIPPED file of type ``7z``): its reader
for Python, py7zr, is Python over six compiled codec packages (PPMd, BCJ, Zstandard,
Deflate64, Brotli, AES), one native decoder per compression method fed untrusted
bytes inside the intake worker, for a format invoices rarely come in.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import mimetypes
import re
import tarfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO

from mailroom.errors import ArchiveRefused
from mailroom.intake.charsets import decode_unlabelled
from mailroom.intake.containers import Nested, Opened

#: Bytes read from a member at a time.
CHUNK_BYTES = 64 * 1024
#: Archives that expand to less than this are never refused for their ratio, in bytes:
#: a small file of repeated text compresses a hundredfold and is still a document.
MIN_RATIO_BYTES = 1024 * 1024
#: Extensions of compressed tar files (a ``.gz`` alone may be one compressed file).
TAR_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tbz", ".tbz2", ".tar.bz2", ".txz", ".tar.xz")
#: Why an encrypted member is not read.
ENCRYPTED = "encrypted in its archive: it cannot be read without the password"
#: Why a link or device entry of a tar is not a file.
NOT_A_FILE = "a link or device entry in its archive, not a file"


@dataclass
class ArchiveBudget:
    """What one mail's archives may still expand to, shared by nested archives."""

    #: Files the mail's archives may still yield.
    members: int
    #: Bytes the mail's archives may still expand to.
    expanded_bytes: int
    #: Largest expanded-to-compressed ratio of an archive (past ``MIN_RATIO_BYTES``).
    max_ratio: int
    #: Members over this are listed with their size, never decompressed, in bytes.
    max_member_bytes: int


def archive_kind(name: str, file_type: str) -> str | None:
    """ "zip" or "tar" for an archive intake opens, else None."""
    lower = name.lower()
    if file_type == "zip":
        return "zip"
    if file_type in ("tar", "tgz") or lower.endswith(TAR_SUFFIXES):
        return "tar"
    return None


def open_archive(
    kind: str, data: bytes, budget: ArchiveBudget, hints: Sequence[str] = ()
) -> Opened:
    """The files of a zip or tar archive, or the reason it yields none (``Opened.error``).

    ``hints`` are the mail's charsets, for zip names stored without their charset.
    """
    opened = Opened(f"archive ({kind})", kind)
    # The budget is charged only for an archive read whole: a refused one yields nothing.
    trial = ArchiveBudget(**budget.__dict__)
    try:
        if kind == "zip":
            opened.files = list(_read_zip(data, trial, len(data), hints))
        else:
            opened.files = list(_read_tar(data, trial, len(data)))
    except ArchiveRefused as exc:
        opened.error = str(exc)
        return opened
    except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError, lzma.LZMAError) as exc:
        opened.error = f"not a readable {kind} archive ({type(exc).__name__}: {str(exc)[:200]})"
        return opened
    budget.members, budget.expanded_bytes = trial.members, trial.expanded_bytes
    return opened


def _read_zip(
    data: bytes, budget: ArchiveBudget, packed: int, hints: Sequence[str]
) -> Iterator[Nested]:
    archive = zipfile.ZipFile(io.BytesIO(data))
    members = [info for info in archive.infolist() if not info.is_dir()]
    _take_members(budget, len(members))
    readable = [m for m in members if not _encrypted(m) and m.file_size <= budget.max_member_bytes]
    declared = sum(m.file_size for m in readable)
    _check_expansion(budget, declared, packed, "declares")
    expanded = 0
    for info in members:
        folder, name = split_member_name(_zip_name(info, hints))
        media_type = _media_type(name)
        if _encrypted(info):
            yield Nested(name, media_type, b"", folder, info.file_size, ENCRYPTED)
            continue
        if info.file_size > budget.max_member_bytes:  # listed with its size, never read
            yield Nested(name, media_type, b"", folder=folder, size=info.file_size)
            continue
        try:
            with archive.open(info) as member:
                content = _read_bounded(member, info.file_size, budget, packed, expanded)
        except NotImplementedError as exc:  # a compression method zipfile lacks
            yield Nested(name, media_type, b"", folder=folder, skip=f"not readable: {exc}")
            continue
        expanded += len(content)
        yield Nested(name, media_type, content, folder=folder)
    budget.expanded_bytes -= expanded


def _read_tar(data: bytes, budget: ArchiveBudget, packed: int) -> Iterator[Nested]:
    # The stream is decompressed through a reader that counts: a tar has no directory to
    # check first, so its headers are read as they come and the whole stream is bounded.
    cap = budget.expanded_bytes + _TAR_OVERHEAD
    stream = _CountingReader(_decompressed(data), cap, budget, packed)
    expanded, count = 0, 0
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for entry in archive:
            if entry.isdir():
                continue
            count += 1
            _take_members(budget, 1)
            folder, name = split_member_name(entry.name)
            media_type = _media_type(name)
            if not entry.isfile():
                yield Nested(name, media_type, b"", folder=folder, skip=NOT_A_FILE)
                continue
            if entry.size > budget.max_member_bytes:
                yield Nested(name, media_type, b"", folder=folder, size=entry.size)
                continue
            _check_expansion(budget, expanded + entry.size, packed, "declares")
            member = archive.extractfile(entry)
            if member is None:
                yield Nested(name, media_type, b"", folder=folder, skip=NOT_A_FILE)
                continue
            content = _read_bounded(member, entry.size, budget, packed, expanded)
            expanded += len(content)
            yield Nested(name, media_type, content, folder=folder)
    budget.expanded_bytes -= expanded


#: Bytes of tar headers and padding allowed on top of the members' bytes.
_TAR_OVERHEAD = 1024 * 1024


def _decompressed(data: bytes) -> io.BufferedIOBase:
    raw = io.BytesIO(data)
    if data.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw)
    if data.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if data.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw)
    return raw


class _CountingReader(io.RawIOBase):
    """A decompressed stream that refuses to yield more than ``cap`` bytes or past the ratio."""

    def __init__(self, inner: io.BufferedIOBase, cap: int, budget: ArchiveBudget, packed: int):
        self._inner, self._cap, self._budget, self._packed = inner, cap, budget, packed
        self._read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        chunk = self._inner.read(min(len(buffer), CHUNK_BYTES))
        self._read += len(chunk)
        if self._read > self._cap:
            raise ArchiveRefused(_over_budget(self._budget))
        _check_ratio(self._budget, self._read, self._packed, "expands to")
        buffer[: len(chunk)] = chunk
        return len(chunk)


def _read_bounded(
    member: IO[bytes],
    declared: int,
    budget: ArchiveBudget,
    packed: int,
    expanded_before: int,
) -> bytes:
    """A member's bytes, read in chunks; refused when it grows past its header or a limit."""
    chunks: list[bytes] = []
    size = 0
    while chunk := member.read(CHUNK_BYTES):
        size += len(chunk)
        if size > declared:
            raise ArchiveRefused("a member is larger than its archive header says: refused")
        if expanded_before + size > budget.expanded_bytes:
            raise ArchiveRefused(_over_budget(budget))
        _check_ratio(budget, expanded_before + size, packed, "expands to")
        chunks.append(chunk)
    return b"".join(chunks)


def _take_members(budget: ArchiveBudget, count: int) -> None:
    if count > budget.members:
        raise ArchiveRefused(
            f"holds more files than the {budget.members} its mail's archives may still yield"
        )
    budget.members -= count


def _check_expansion(budget: ArchiveBudget, expanded: int, packed: int, verb: str) -> None:
    if expanded > budget.expanded_bytes:
        raise ArchiveRefused(_over_budget(budget, verb=verb, expanded=expanded))
    _check_ratio(budget, expanded, packed, verb)


def _check_ratio(budget: ArchiveBudget, expanded: int, packed: int, verb: str) -> None:
    if expanded > MIN_RATIO_BYTES and expanded > budget.max_ratio * max(packed, 1):
        raise ArchiveRefused(
            f"{verb} {expanded} bytes from {packed}: over the compression ratio limit of "
            f"{budget.max_ratio} (an archive bomb)"
        )


def _over_budget(budget: ArchiveBudget, *, verb: str = "expands to", expanded: int = 0) -> str:
    told = f" {expanded} bytes" if expanded else " more"
    return (
        f"{verb}{told} than the {budget.expanded_bytes} bytes its mail's archives may still "
        "expand to"
    )


def _zip_name(info: zipfile.ZipInfo, hints: Sequence[str]) -> str:
    """A member's name: UTF-8 when flagged so, else its bytes in the mail's charsets.

    Zip tools write names in the local charset (GBK in China) without saying so; zipfile
    reads them as CP437, which turns them into mojibake.
    """
    if info.flag_bits & 0x800:
        return info.filename
    try:
        raw = info.filename.encode("cp437")
    except UnicodeEncodeError:
        return info.filename
    return decode_unlabelled(raw, hints) if not raw.isascii() else info.filename


def _encrypted(info: zipfile.ZipInfo) -> bool:
    return bool(info.flag_bits & 0x1)


def _media_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


#: Path separators of every system an archive may come from.
_SEPARATORS = re.compile(r"[/\\]")


def split_member_name(raw: str) -> tuple[str, str]:
    """A member's folder inside its archive and its name, with no part that climbs or roots.

    ``../../etc/passwd`` is ``("etc", "passwd")``; ``C:\\x\\a.csv`` is ``("C:/x", "a.csv")``.
    """
    parts = [p for p in _SEPARATORS.split(raw) if p not in ("", ".", "..")]
    if not parts:
        return "", ""
    return "/".join(parts[:-1]), parts[-1]
