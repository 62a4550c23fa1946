"""The object registry: one ``stored_object`` row per (bucket, key), reused on conflict."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.adapters.storage import BucketRole, StoredRef
from mailroom.db.models import StoredObject


async def register_object(
    session: AsyncSession, ref: StoredRef, *, role: BucketRole, created_by: str
) -> StoredObject:
    """Insert the object's row, or return the one already registered for its bucket and key."""
    await session.execute(
        insert(StoredObject)
        .values(
            bucket_role=role,
            bucket=ref.bucket,
            key=ref.key,
            size=ref.size,
            sha256=ref.sha256,
            media_type=ref.media_type,
            created_by=created_by,
        )
        .on_conflict_do_nothing(index_elements=["bucket", "key"])
    )
    row = await session.scalar(
        select(StoredObject).where(StoredObject.bucket == ref.bucket, StoredObject.key == ref.key)
    )
    assert row is not None  # inserted above or already there; the unique key guarantees one
    return row
