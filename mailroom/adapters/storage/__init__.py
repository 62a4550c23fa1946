"""Object storage: a filesystem store (default, dev) and S3 through boto3.

Keys are content-addressed (``content_key``), so a put of the same bytes is
idempotent and a re-ingested mail never duplicates its objects. ``store`` holds
the port and what both stores share; ``filesystem`` and ``s3`` the stores.
"""

from __future__ import annotations

import asyncio

from mailroom.adapters.storage.filesystem import FilesystemStore
from mailroom.adapters.storage.s3 import S3Store
from mailroom.adapters.storage.store import (
    BucketRole,
    ObjectStore,
    PutOutcome,
    PutRequest,
    StoredRef,
    content_key,
    digest_key,
    put_concurrently,
    sha256_hex,
)
from mailroom.settings import Settings

__all__ = [
    "BucketRole",
    "FilesystemStore",
    "ObjectStore",
    "PutOutcome",
    "PutRequest",
    "S3Store",
    "StoredRef",
    "build_store",
    "content_key",
    "create_buckets",
    "digest_key",
    "put_concurrently",
    "sha256_hex",
]


def build_store(settings: Settings) -> ObjectStore:
    if settings.storage.kind == "s3":
        return S3Store(settings.storage)
    return FilesystemStore(settings.storage, settings.storage_root.resolve())


def create_buckets(settings: Settings) -> tuple[list[str], list[str]]:
    """Create every bucket the settings name that is missing: (all of them, the ones created).

    For setup commands (``mailroom migrate``, ``mailroom dev``), outside any event loop.
    """
    store = build_store(settings)
    try:
        return store.bucket_names(), asyncio.run(store.create_buckets())
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
