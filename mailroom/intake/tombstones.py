"""Erased mails stay erased: intake knows them again by their tombstones (``erased_mail``).

An erased mail leaves the SHA-256 of its bytes and of its Message-ID. A mail read again
(a cursor moved back, a changed UIDVALIDITY, a copy in another folder or mailbox, a second
delivery with other headers but the same Message-ID) matches one of them and is skipped:
nothing of it is stored, no file, job or notification comes of it, and the cursor moves
past it. The group is checked before its objects go to the store (one query per group);
the mail's statement checks again, for an erase that committed meanwhile.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from sqlalchemy import or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.storage import StoredRef
from mailroom.db.engine import transaction
from mailroom.db.models import ErasedMail, ObjectDeletion, StoredObject


def message_id_digest(message_id: str | None) -> str | None:
    """The SHA-256 a tombstone keeps of a Message-ID (None for a mail without one)."""
    if message_id is None:
        return None
    return hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()


def tombstone(content_sha256: str | None, message_id: str | None) -> ErasedMail | None:
    """The tombstone of a mail; None when it has neither a hash nor a Message-ID."""
    digest = message_id_digest(message_id)
    if content_sha256 is None and digest is None:
        return None
    return ErasedMail(content_sha256=content_sha256, message_id_sha256=digest)


async def erased_among(
    sessions: async_sessionmaker[AsyncSession], mails: Sequence[tuple[str, str | None]]
) -> list[bool]:
    """For each (content SHA-256, Message-ID): whether an erased mail matches it."""
    if not mails:
        return []
    hashes = sorted({sha for sha, _ in mails})
    digests = sorted({d for _, mid in mails if (d := message_id_digest(mid)) is not None})
    async with sessions() as session:
        rows = (
            await session.execute(
                select(ErasedMail.content_sha256, ErasedMail.message_id_sha256).where(
                    or_(
                        ErasedMail.content_sha256.in_(hashes),
                        ErasedMail.message_id_sha256.in_(digests),
                    )
                )
            )
        ).all()
    erased_hashes = {row.content_sha256 for row in rows}
    erased_ids = {row.message_id_sha256 for row in rows} - {None}
    return [sha in erased_hashes or message_id_digest(mid) in erased_ids for sha, mid in mails]


async def drop_unregistered(
    sessions: async_sessionmaker[AsyncSession], refs: Sequence[StoredRef]
) -> None:
    """Queue for deletion the objects of a mail found erased after they were stored.

    Only those no row registers (content-addressed: another mail may share one); the
    retention pass deletes them, and keeps any registered again meanwhile.
    """
    async with transaction(sessions) as session:
        for ref in refs:
            registered = await session.scalar(
                select(StoredObject.id).where(
                    StoredObject.bucket == ref.bucket, StoredObject.key == ref.key
                )
            )
            if registered is None:
                await session.execute(
                    insert(ObjectDeletion)
                    .values(bucket=ref.bucket, key=ref.key)
                    .on_conflict_do_nothing(index_elements=["bucket", "key"])
                )
