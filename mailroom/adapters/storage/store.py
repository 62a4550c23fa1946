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


def check_key(key: str) -> str:
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
