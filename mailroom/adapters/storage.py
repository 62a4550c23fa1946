"""Object storage: a filesystem store (default, dev) and S3 through boto3.

Keys are content-addressed (``content_key``), so a put of the same bytes is
idempotent and a re-ingested mail never duplicates its objects. boto3 is
blocking, so every S3 call runs in a thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from mailroom.errors import PermanentError, RetryableError
from mailroom.settings import Settings, StorageSettings

BucketRole = Literal["mail", "incoming", "results"]


class ObjectNotFound(PermanentError):
    """The object does not exist in the store."""


class StorageUnavailable(RetryableError):
    """The object store could not be reached."""


class InvalidKey(PermanentError):
    """The object key is not a safe relative path."""


@dataclass(frozen=True)
class StoredRef:
    bucket: str
    key: str
    size: int
    sha256: str
    media_type: str


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_key(data: bytes, *, prefix: str, suffix: str = "") -> str:
    """``prefix/ab/abcdef…suffix``: the same bytes always land on the same key."""
    digest = sha256_hex(data)
    return f"{prefix.strip('/')}/{digest[:2]}/{digest}{suffix}"


def _check_key(key: str) -> str:
    # POSIX rules: absolute means a leading slash, which also gives an empty first part.
    if not key or any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidKey(f"unsafe object key {key[:100]!r}")
    return key


@dataclass(frozen=True)
class PutRequest:
    """One object for ``ObjectStore.put_many``."""

    role: BucketRole
    key: str
    data: bytes
    media_type: str


#: What ``put_many`` gives for each request: where it was stored, or why it was not.
PutOutcome = StoredRef | Exception


class ObjectStore(Protocol):
    def bucket(self, role: BucketRole) -> str: ...

    async def put(
        self, role: BucketRole, key: str, data: bytes, *, media_type: str
    ) -> StoredRef: ...

    async def put_many(self, requests: Sequence[PutRequest]) -> list[PutOutcome]:
        """Store several objects; one failing never stops the others (outcomes in order)."""
        ...

    async def get(self, bucket: str, key: str) -> bytes: ...

    async def size(self, bucket: str, key: str) -> int:
        """The object's size in bytes, without reading it (``ObjectNotFound`` if absent)."""
        ...

    async def exists(self, bucket: str, key: str) -> bool: ...


class _Buckets:
    def __init__(self, settings: StorageSettings) -> None:
        self._buckets: dict[str, str] = {
            "mail": settings.mail_bucket,
            "incoming": settings.incoming_bucket,
            "results": settings.results_bucket,
        }

    def bucket(self, role: BucketRole) -> str:
        return self._buckets[role]


class FilesystemStore(_Buckets):
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
        return os.path.join(self._root, _check_key(bucket), _check_key(key))

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


class S3Store(_Buckets):
    """S3 (or MinIO, or moto's server) through boto3, buckets created on first use."""

    def __init__(self, settings: StorageSettings) -> None:
        super().__init__(settings)
        import boto3
        from botocore.config import Config

        self._client: Any = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            region_name=settings.s3_region,
            aws_access_key_id=settings.s3_access_key.get_secret_value() or None,
            aws_secret_access_key=settings.s3_secret_key.get_secret_value() or None,
            config=Config(
                retries={"max_attempts": settings.s3_retries},
                connect_timeout=settings.s3_connect_timeout_s,
                read_timeout=settings.s3_read_timeout_s,
            ),
        )
        self._ready: set[str] = set()

    def _translate(self, exc: Exception, what: str) -> Exception:
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound", "NoSuchBucket"):
                return ObjectNotFound(what)
            if code.startswith("5") or code in ("SlowDown", "RequestTimeout", "ServiceUnavailable"):
                return StorageUnavailable(f"{what}: {code}")
            return PermanentError(f"{what}: {code}")
        if isinstance(exc, BotoCoreError):
            return StorageUnavailable(f"{what}: {exc}")
        return exc

    def _ensure_bucket(self, bucket: str) -> None:
        if bucket in self._ready:
            return
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=bucket)
        except ClientError:
            try:
                self._client.create_bucket(Bucket=bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in (
                    "BucketAlreadyOwnedByYou",
                    "BucketAlreadyExists",
                ):
                    raise
        self._ready.add(bucket)

    def _put(self, bucket: str, key: str, data: bytes, media_type: str) -> None:
        self._ensure_bucket(bucket)
        self._client.put_object(Bucket=bucket, Key=key, Body=data, ContentType=media_type)

    async def put(self, role: BucketRole, key: str, data: bytes, *, media_type: str) -> StoredRef:
        bucket = self.bucket(role)
        _check_key(key)
        try:
            await asyncio.to_thread(self._put, bucket, key, data, media_type)
        except Exception as exc:
            raise self._translate(exc, f"put {bucket}/{key}") from exc
        return StoredRef(bucket, key, len(data), sha256_hex(data), media_type)

    async def put_many(self, requests: Sequence[PutRequest]) -> list[PutOutcome]:
        return await put_concurrently(self, requests)

    def _get(self, bucket: str, key: str) -> bytes:
        response = self._client.get_object(Bucket=bucket, Key=key)
        body = response["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    async def get(self, bucket: str, key: str) -> bytes:
        try:
            return await asyncio.to_thread(self._get, bucket, key)
        except Exception as exc:
            raise self._translate(exc, f"get {bucket}/{key}") from exc

    async def size(self, bucket: str, key: str) -> int:
        try:
            head = await asyncio.to_thread(self._client.head_object, Bucket=bucket, Key=key)
        except Exception as exc:
            raise self._translate(exc, f"head {bucket}/{key}") from exc
        return int(head["ContentLength"])

    async def exists(self, bucket: str, key: str) -> bool:
        try:
            await asyncio.to_thread(self._client.head_object, Bucket=bucket, Key=key)
        except Exception as exc:
            translated = self._translate(exc, f"head {bucket}/{key}")
            if isinstance(translated, ObjectNotFound):
                return False
            raise translated from exc
        return True

    def close(self) -> None:
        self._client.close()


async def put_concurrently(store: ObjectStore, requests: Sequence[PutRequest]) -> list[PutOutcome]:
    """``put_many`` from ``put``: every put at once, each outcome kept, cancellation propagated."""
    results = await asyncio.gather(
        *(store.put(r.role, r.key, r.data, media_type=r.media_type) for r in requests),
        return_exceptions=True,
    )
    outcomes: list[PutOutcome] = []
    for result in results:
        if isinstance(result, Exception | StoredRef):
            outcomes.append(result)
        else:  # CancelledError and other BaseExceptions are not an object's outcome
            raise result
    return outcomes


def build_store(settings: Settings) -> ObjectStore:
    if settings.storage.kind == "s3":
        return S3Store(settings.storage)
    return FilesystemStore(settings.storage, settings.storage_root.resolve())
