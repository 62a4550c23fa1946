"""Erasure of one mail and everything derived from it; the legal hold that stops it.

``erase_mail`` deletes, in one transaction, the mail row, its files (containers
and what was extracted from them), their recognition jobs, documents and the
channel messages about the mail or its documents, then releases the objects
nothing else refers to (``lifecycle.objects``) and deletes them from the store
at once, after the commit. It leaves a tombstone (``erased_mail``: the SHA-256 of the
mail's bytes and of its Message-ID) so intake never stores it again. Messages already
sent cannot be recalled: their rows
go too (they carry the mail's sender and subject), and the audit event keeps
their ids, so a record of what was sent stays without its content.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.storage import ObjectStore
from mailroom.db.audit import OPERATOR, add_audit_event
from mailroom.db.engine import transaction
from mailroom.db.models import (
    ChannelMessage,
    Document,
    InboundMail,
    MailboxCursor,
    RecognitionJob,
    StoredFile,
)
from mailroom.errors import MailNotFound, MailOnLegalHold
from mailroom.intake.audit import cursor_target
from mailroom.intake.tombstones import tombstone
from mailroom.lifecycle.objects import DeletionReport, delete_queued_objects, release_objects
from mailroom.lifecycle.scrub import ErasedRecords, scrub_audit, scrub_cursor

#: ``action`` of the audit events the operator commands leave.
ERASE_ACTION = "intake.erase"
HOLD_ACTION = "intake.hold"
RELEASE_ACTION = "intake.release"


@dataclass(frozen=True)
class EraseReport:
    mail_id: int
    #: False: there was no such mail (erased before, or never there).
    erased: bool
    files: int = 0
    jobs: int = 0
    documents: int = 0
    channel_messages: int = 0
    #: Audit rows about the mail whose content was removed (who, what and when stay).
    audit_rows_scrubbed: int = 0
    objects_queued: int = 0
    deletion: DeletionReport | None = None


async def _mail_files(session: AsyncSession, mail_id: int) -> list[int]:
    """The mail's files, with files extracted from its containers even if not stamped."""
    found: set[int] = set()
    frontier = list(
        await session.scalars(
            select(StoredFile.id).where(StoredFile.mail_id == mail_id).with_for_update()
        )
    )
    while frontier:
        found.update(frontier)
        children = await session.scalars(
            select(StoredFile.id)
            .where(StoredFile.parent_file_id.in_(frontier))
            .where(StoredFile.id.not_in(found))
            .with_for_update()
        )
        frontier = list(children)
    return sorted(found)


async def _erase_rows(
    session: AsyncSession, mail: InboundMail, operator: str
) -> tuple[EraseReport, list[int]]:
    """Delete the rows; returns the report and the object deletions queued."""
    file_ids = await _mail_files(session, mail.id)
    file_objects = await session.scalars(
        select(StoredFile.object_id).where(StoredFile.id.in_(file_ids))
    )
    jobs = (
        await session.execute(
            select(RecognitionJob.id, RecognitionJob.result_object_id).where(
                RecognitionJob.file_id.in_(file_ids)
            )
        )
    ).all()
    document_ids = list(
        await session.scalars(select(Document.id).where(Document.file_id.in_(file_ids)))
    )
    message_ids = list(
        await session.scalars(
            select(ChannelMessage.id).where(
                or_(ChannelMessage.mail_id == mail.id, ChannelMessage.document_id.in_(document_ids))
            )
        )
    )
    cursor = (
        await session.execute(
            select(MailboxCursor.mailbox, MailboxCursor.folder).where(
                MailboxCursor.id == mail.cursor_id
            )
        )
    ).one_or_none()
    mailbox = cursor.mailbox if cursor else None
    object_ids = [mail.raw_object_id, *file_objects, *(job.result_object_id for job in jobs)]
    # Children before parents: messages, documents, jobs, files (unlinked first), the mail.
    await session.execute(delete(ChannelMessage).where(ChannelMessage.id.in_(message_ids)))
    await session.execute(delete(Document).where(Document.id.in_(document_ids)))
    await session.execute(delete(RecognitionJob).where(RecognitionJob.file_id.in_(file_ids)))
    await session.execute(
        update(StoredFile).where(StoredFile.id.in_(file_ids)).values(parent_file_id=None)
    )
    await session.execute(delete(StoredFile).where(StoredFile.id.in_(file_ids)))
    await session.execute(delete(InboundMail).where(InboundMail.id == mail.id))
    # What intake knows it by if it is read again (intake.tombstones): hashes, no content.
    if (gone := tombstone(mail.content_sha256, mail.message_id)) is not None:
        session.add(gone)
    queued = await release_objects(session, object_ids)
    await scrub_cursor(session, mail.cursor_id, mail.uid)
    scrubbed = await scrub_audit(
        session,
        ErasedRecords(
            mail_id=mail.id,
            file_ids=file_ids,
            job_ids=[str(job.id) for job in jobs],
            document_ids=document_ids,
            channel_message_ids=message_ids,
            cursor_target=cursor_target(cursor.mailbox, cursor.folder) if cursor else None,
            uidvalidity=mail.uidvalidity,
            uid=mail.uid,
        ),
    )
    report = EraseReport(
        mail.id,
        True,
        files=len(file_ids),
        jobs=len(jobs),
        documents=len(document_ids),
        channel_messages=len(message_ids),
        audit_rows_scrubbed=scrubbed,
        objects_queued=len(queued),
    )
    # Ids and counts only: nothing of the mail's content (sender, subject) is kept.
    add_audit_event(
        session,
        actor_type=OPERATOR,
        actor_id=operator,
        action=ERASE_ACTION,
        target=f"mail:{mail.id}",
        detail={
            "mailbox": mailbox,
            "file_ids": file_ids,
            "job_ids": [str(job.id) for job in jobs],
            "document_ids": document_ids,
            "channel_message_ids": message_ids,
            "objects_queued": len(queued),
            "audit_rows_scrubbed": scrubbed,
            "purged_before": mail.purged_at is not None,
        },
    )
    return report, queued


async def erase_mail(
    sessions: async_sessionmaker[AsyncSession], store: ObjectStore, mail_id: int, *, operator: str
) -> EraseReport:
    """Erase the mail and what came from it; refuse one on legal hold (``MailOnLegalHold``)."""
    async with transaction(sessions) as session:
        mail = await session.scalar(
            select(InboundMail).where(InboundMail.id == mail_id).with_for_update()
        )
        if mail is None:
            return EraseReport(mail_id, False)
        if mail.legal_hold:
            raise MailOnLegalHold(
                f"mail {mail_id} is on legal hold; release it first (mailroom intake release)"
            )
        report, queued = await _erase_rows(session, mail, operator)
    # After the commit: a crash here leaves the queue rows for the retention pass.
    deletion = await delete_queued_objects(sessions, store, grace_s=0, only=queued)
    return replace(report, deletion=deletion)


async def set_legal_hold(
    sessions: async_sessionmaker[AsyncSession], mail_id: int, *, held: bool, operator: str
) -> bool:
    """Put the mail on legal hold (or release it); False when it already was so."""
    async with transaction(sessions) as session:
        mail = await session.scalar(
            select(InboundMail).where(InboundMail.id == mail_id).with_for_update()
        )
        if mail is None:
            raise MailNotFound(f"no mail {mail_id}")
        if mail.legal_hold == held:
            return False
        mail.legal_hold = held
        add_audit_event(
            session,
            actor_type=OPERATOR,
            actor_id=operator,
            action=HOLD_ACTION if held else RELEASE_ACTION,
            target=f"mail:{mail_id}",
            detail={"purged_before": mail.purged_at is not None},
        )
    return True
