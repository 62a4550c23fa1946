"""Objects shared by content address: released with their last row, deleted after commit.

Keys are content-addressed, so one object may be the body of several mails or the
bytes of several files. A caller that stops referring to objects calls
``release_objects`` in the same transaction: the rows nothing refers to any more
are dropped and their (bucket, key) queued in ``object_deletion``. After the
commit ``delete_queued_objects`` deletes them from the store; a crash in between
leaves the queue rows for the next retention pass, so nothing dangles for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import CompoundSelect, delete, func, select, union_all
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.storage import ObjectStore
from mailroom.db.clock import db_after
from mailroom.db.engine import transaction
from mailroom.db.models import InboundMail, ObjectDeletion, RecognitionJob, StoredFile, StoredObject
from mailroom.errors import AppError

logger = logging.getLogger(__name__)

#: Queue rows one deletion transaction takes (each is one store call while its row is locked).
DELETION_CHUNK = 20


def _references(ids: list[int]) -> CompoundSelect[tuple[int | None]]:
    """Every row that still names one of ``ids`` (each foreign key to ``stored_object``)."""
    return union_all(
        select(InboundMail.raw_object_id.label("id")).where(InboundMail.raw_object_id.in_(ids)),
        select(StoredFile.object_id).where(StoredFile.object_id.in_(ids)),
        select(RecognitionJob.result_object_id).where(RecognitionJob.result_object_id.in_(ids)),
    )


async def release_objects(session: AsyncSession, object_ids: Iterable[int | None]) -> list[int]:
    """Drop the rows of these objects that nothing refers to now; queue their deletion.

    Call it in the transaction that removed the references. The object rows are locked
    first: a transaction inserting a new reference (its foreign key check) either
    committed before, and is seen here, or waits and then fails on the dropped row.
    Returns the ids of the queue rows.
    """
    ids = sorted({i for i in object_ids if i is not None})
    if not ids:
        return []
    rows = (
        await session.execute(
            select(StoredObject.id, StoredObject.bucket, StoredObject.key)
            .where(StoredObject.id.in_(ids))
            .order_by(StoredObject.id)
            .with_for_update()
        )
    ).all()
    referenced = set(await session.scalars(_references(ids)))
    free = [row for row in rows if row.id not in referenced]
    if not free:
        return []
    await session.execute(delete(StoredObject).where(StoredObject.id.in_([r.id for r in free])))
    queued = await session.scalars(
        insert(ObjectDeletion)
        .values([{"bucket": r.bucket, "key": r.key} for r in free])
        .on_conflict_do_update(index_elements=["bucket", "key"], set_={"requested_at": func.now()})
        .returning(ObjectDeletion.id)
    )
    return list(queued)


@dataclass
class DeletionReport:
    #: Objects deleted from the store.
    deleted: int = 0
    #: Queued objects registered again meanwhile (the same bytes stored anew): kept.
    kept: int = 0
    #: Deletes the store refused this time; their rows stay queued for the next pass.
    failed: int = 0


async def delete_queued_objects(
    sessions: async_sessionmaker[AsyncSession],
    store: ObjectStore,
    *,
    grace_s: float,
    only: list[int] | None = None,
) -> DeletionReport:
    """Delete queued objects requested at least ``grace_s`` ago (or just those ``only``).

    Each queue row is locked (``SKIP LOCKED``: two passes share the work) while its object
    is deleted, and dropped with it; an object registered again since it was queued is kept.
    """
    report = DeletionReport()
    after_id = 0
    while True:
        async with transaction(sessions) as session:
            query = (
                select(ObjectDeletion)
                .where(ObjectDeletion.id > after_id)
                .order_by(ObjectDeletion.id)
                .limit(DELETION_CHUNK)
                .with_for_update(skip_locked=True)
            )
            if only is not None:
                query = query.where(ObjectDeletion.id.in_(only))
            else:
                query = query.where(ObjectDeletion.requested_at <= db_after(-grace_s))
            chunk = list(await session.scalars(query))
            for row in chunk:
                await _delete_one(session, store, row, report)
        if len(chunk) < DELETION_CHUNK:
            return report
        after_id = chunk[-1].id


async def _delete_one(
    session: AsyncSession, store: ObjectStore, row: ObjectDeletion, report: DeletionReport
) -> None:
    registered = await session.scalar(
        select(StoredObject.id).where(
            StoredObject.bucket == row.bucket, StoredObject.key == row.key
        )
    )
    if registered is not None:
        report.kept += 1
    else:
        try:
            await store.delete(row.bucket, row.key)
        except AppError as exc:
            row.attempts += 1
            row.last_error = str(exc)[:500]
            report.failed += 1
            logger.warning("Deleting object %s/%s failed: %s", row.bucket, row.key, exc)
            return
        report.deleted += 1
    await session.delete(row)
