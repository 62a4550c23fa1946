"""The object store port: bucket roles, stored references, content-addressed keys.

Keys are content-addressed (``content_key``), so a put of the same bytes is
idempotent and a re-ingested mail never duplicates its objects.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from mailroom.errors import (
    InvalidKey,
)
from mailroom.settings import StorageSettings

BucketRole = Literal["mail", "incoming", "results"]


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
    return digest_key(sha256_hex(data), prefix=prefix, suffix=suffix)


def digest_key(digest: str, *, prefix: str, suffix: str = "") -> str:
    """``content_key`` of bytes whose SHA-256 (hex) the caller has already computed."""
    return f"{prefix.strip('/')}/{digest[:2]}/{digest}{suffix}"


#: Longest object key, in UTF-8 bytes (S3's limit).
MAX_KEY_BYTES = 1024


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a safe relative object key, or None when it is.

    The one rule for every key Mailroom stores, reads or registers: the keys it writes and
    the ``result_s3`` keys a recognition service names. Never repeats the key (it may carry
    a NUL or a terminal escape).
    """
    if not key:
        return "empty"
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return f"longer than {MAX_KEY_BYTES} bytes"
    if any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in key):
        return "holds a NUL or another control character"
    # POSIX rules: absolute means a leading slash, which also gives an empty first part.
    if key.startswith("/"):
        return "an absolute path"
    if any(part in ("", ".", "..") for part in key.split("/")):
        return "has an empty, '.' or '..' part"
    return None


def check_key(key: str) -> str:
    """``key`` when it is safe (``key_problem``); else ``InvalidKey``."""
    problem = key_problem(key)
    if problem is not None:
        shown = "".join(c if c.isprintable() else "?" for c in key[:100])
        raise InvalidKey(f"unsafe object key {shown!r}: {problem}")
    return key


@dataclass(frozen=True)
class PutRequest:
    """One object for ``ObjectStore.put_many``."""

    role: BucketRole
    key: str
    data: bytes
    media_type: str
    #: SHA-256 of ``data`` (hex) when the caller has it: a store then hashes nothing again
    #: (intake hashed each mail three times, 40 MB ones included).
    sha256: str | None = None


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

    async def delete(self, bucket: str, key: str) -> None:
        """Remove the object; an object already gone is no error (deletes may repeat)."""
        ...

    def bucket_names(self) -> list[str]:
        """Every bucket the settings name (mail, incoming, results), each once."""
        ...

    async def missing_buckets(self) -> list[str]:
        """The buckets of ``bucket_names`` that do not exist."""
        ...

    async def create_buckets(self) -> list[str]:
        """Create the buckets of ``bucket_names`` that are missing; the ones it created."""
        ...


class Buckets:
    def __init__(self, settings: StorageSettings) -> None:
        self._buckets: dict[str, str] = {
            "mail": settings.mail_bucket,
            "incoming": settings.incoming_bucket,
            "results": settings.results_bucket,
        }

    def bucket(self, role: BucketRole) -> str:
        return self._buckets[role]

    def bucket_names(self) -> list[str]:
        return list(dict.fromkeys(self._buckets.values()))


async def put_concurrently(store: ObjectStore, requests: Sequence[PutRequest]) -> list[PutOutcome]:
    """``put_many`` from ``put``: every put at once, each outcome kept, cancellation propagated."""
    return await gather_outcomes(
        [store.put(r.role, r.key, r.data, media_type=r.media_type) for r in requests]
    )


async def gather_outcomes(puts: Sequence[Awaitable[StoredRef]]) -> list[PutOutcome]:
    """Run ``puts`` at once: each one's ``StoredRef`` or error, in order; cancellation propagated."""
    results = await asyncio.gather(*puts, return_exceptions=True)
    outcomes: list[PutOutcome] = []
    for result in results:
        if isinstance(result, Exception | StoredRef):
            outcomes.append(result)
        else:  # CancelledError and other BaseExceptions are not an object's outcome
            raise result
    return outcomes
