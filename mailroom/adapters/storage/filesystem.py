"""The filesystem object store (default, dev): buckets are folders under a root."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mailroom.adapters.storage.store import (
    BucketRole,
    Buckets,
    PutOutcome,
    PutRequest,
    StoredRef,
    check_key,
    sha256_hex,
)
from mailroom.errors import ObjectNotFound
from mailroom.settings import StorageSettings


class FilesystemStore(Buckets):
    """Buckets are folders under ``root``; a reader never sees a partial object.

    A new object is created under its final, content-addressed name with
    ``O_EXCL`` (no temp file, no stat, no mkdir unless the folder is missing):
    its key is registered only after ``put`` returns, and a half-written file
    left by a crash fails the content check of the next ``put`` of the same key,
    which repairs it with a temp file + rename. Files and the folders that name
    them are fsynced before ``put`` returns, so a stored object survives a power cut. Writes run in a thread: on a
    busy or full filesystem creating an inode can take milliseconds of kernel
    time, which then overlaps the caller's other work instead of stalling it.
    """

    def __init__(self, settings: StorageSettings, root: Path) -> None:
        super().__init__(settings)
        self.root = root
        self._root = str(root)

    def _path(self, bucket: str, key: str) -> str:
        return os.path.join(self._root, check_key(bucket), check_key(key))

    async def put(self, role: BucketRole, key: str, data: bytes, *, media_type: str) -> StoredRef:
        bucket = self.bucket(role)
        path = self._path(bucket, key)
        await asyncio.to_thread(_write_durably, path, data)
        return StoredRef(bucket, key, len(data), sha256_hex(data), media_type)

    async def put_many(self, requests: Sequence[PutRequest]) -> list[PutOutcome]:
        # One thread hop for all of them: the hop costs the event loop more than a small write.
        return await asyncio.to_thread(self._put_all, list(requests))

    def _put_all(self, requests: list[PutRequest]) -> list[PutOutcome]:
        outcomes: list[PutOutcome] = []
        written: list[tuple[int, set[str]]] = []  # (outcome index, folders to sync)
        for r in requests:
            try:
                folders = _write_object(self._path(self.bucket(r.role), r.key), r.data)
            except Exception as exc:  # reported for its own request, the others go on
                outcomes.append(exc)
                continue
            written.append((len(outcomes), folders))
            outcomes.append(
                StoredRef(self.bucket(r.role), r.key, len(r.data), sha256_hex(r.data), r.media_type)
            )
        # One fsync per folder for the whole group: the new names are durable before any
        # of them is reported stored (and so before the mail's transaction commits).
        synced: dict[str, Exception | None] = {}
        for index, folders in written:
            for folder in sorted(folders, key=len, reverse=True):
                if folder not in synced:
                    synced[folder] = _fsync_folder_or_error(folder)
                error = synced[folder]
                if error is not None:
                    outcomes[index] = error
        return outcomes

    async def get(self, bucket: str, key: str) -> bytes:
        path = Path(self._path(bucket, key))
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{bucket}/{key}") from exc

    async def size(self, bucket: str, key: str) -> int:
        path = self._path(bucket, key)
        try:
            return (await asyncio.to_thread(os.stat, path)).st_size
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{bucket}/{key}") from exc

    async def exists(self, bucket: str, key: str) -> bool:
        return await asyncio.to_thread(os.path.exists, self._path(bucket, key))

    async def delete(self, bucket: str, key: str) -> None:
        await asyncio.to_thread(_unlink_quietly, self._path(bucket, key))


#: Create only, never open an existing file; objects are private like the mail they hold.
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_CREATE_MODE = 0o600


def _write_durably(path: str, data: bytes) -> None:
    """Store one object and sync the folders whose entries it changed."""
    for folder in sorted(_write_object(path, data), key=len, reverse=True):
        _fsync_folder(folder)


def _write_object(path: str, data: bytes) -> set[str]:
    """Store ``data`` at ``path`` (file synced) unless the same bytes are already there.

    Returns the folders whose entries changed: the caller syncs them before it
    reports the object stored. An existing file is trusted only when its content
    hash is that of ``data``: a crash can leave a torn file of the right size.
    """
    try:
        fd, folders = _create(path)
    except FileExistsError:
        if _same_content(path, data):
            return set()
        _replace_atomically(path, data)  # torn or foreign content left by an interrupted put
        return {os.path.dirname(path)}
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        _discard_own(fd, path)
        raise
    os.close(fd)
    return folders


def _same_content(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as existing:
            if os.fstat(existing.fileno()).st_size != len(data):
                return False
            return hashlib.file_digest(existing, "sha256").hexdigest() == sha256_hex(data)
    except FileNotFoundError:
        return False


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder_or_error(folder: str) -> Exception | None:
    try:
        _fsync_folder(folder)
    except OSError as exc:
        return exc
    return None


def _discard_own(fd: int, path: str) -> None:
    """Close and remove a file this put created, unless another put replaced it since."""
    try:
        ours = os.fstat(fd).st_ino
        if os.stat(path).st_ino == ours:
            os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _create(path: str) -> tuple[int, set[str]]:
    """A new file at ``path``, and the folders whose entries changed (to sync)."""
    folder = os.path.dirname(path)
    try:
        return os.open(path, _CREATE_FLAGS, _CREATE_MODE), {folder}
    except FileNotFoundError:  # first object under this prefix
        created = _make_folders(folder)
        return os.open(path, _CREATE_FLAGS, _CREATE_MODE), {folder, *created}


def _make_folders(folder: str) -> set[str]:
    """``makedirs``, returning the parents whose entries changed (a new folder in each)."""
    missing = []
    current = folder
    while current and not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    os.makedirs(folder, exist_ok=True)
    return {os.path.dirname(m) for m in missing}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _replace_atomically(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
