"""The retention pass: the objects of old, settled mails are removed in bounded batches.

A mailbox's ``retention_days`` says how long a final mail keeps its body (the
``.eml``), its files' bytes and its recognition results. Past it, one short
transaction per batch locks the mails (``FOR UPDATE SKIP LOCKED``: passes and
operators never wait on each other), drops their references, stamps
``purged_at`` and releases the objects (``lifecycle.objects``), with one audit
event of counts. Rows stay: the mail's headers, its files' names and statuses,
jobs and documents, the notifications sent. A mail still in flight (not final,
not yet notified, a job or a notification still open) or on legal hold is skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, exists, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import InstrumentedAttribute

from mailroom.adapters.storage import ObjectStore
from mailroom.config_store import effective
from mailroom.db.audit import SYSTEM, add_audit_event
from mailroom.db.clock import db_after
from mailroom.db.engine import transaction
from mailroom.db.models import (
    FINAL_FILE_STATUSES,
    FINAL_JOB_STATUSES,
    ChannelMessage,
    InboundMail,
    MailboxCursor,
    RecognitionJob,
    StoredFile,
)
from mailroom.lifecycle.objects import DeletionReport, delete_queued_objects, release_objects
from mailroom.process.identity import host_pid
from mailroom.settings import Settings

logger = logging.getLogger(__name__)

#: ``action`` of the audit event each purged batch leaves.
PURGE_ACTION = "retention.purge"

SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class BatchReport:
    mails: int
    files: int
    results: int
    objects_queued: int


@dataclass
class RetentionReport:
    #: Mails purged, per mailbox name.
    purged: dict[str, int] = field(default_factory=dict)
    deletion: DeletionReport = field(default_factory=DeletionReport)


def _settled(mail_id: InstrumentedAttribute[int]) -> ColumnElement[bool]:
    """Nothing of the mail is still in flight: files and jobs final, no open notification."""
    open_file = exists().where(
        StoredFile.mail_id == mail_id, StoredFile.status.not_in(FINAL_FILE_STATUSES)
    )
    open_job = (
        exists()
        .where(StoredFile.mail_id == mail_id, RecognitionJob.file_id == StoredFile.id)
        .where(
            RecognitionJob.status.not_in(FINAL_JOB_STATUSES)
            # A result the unmapped sweep would still send to mapping, which reads its object.
            | (
                RecognitionJob.status.in_(("done", "needs_check", "error"))
                & RecognitionJob.mapped_at.is_(None)
                & RecognitionJob.result_msg_id.is_not(None)
            )
        )
    )
    open_message = exists().where(
        ChannelMessage.mail_id == mail_id, ChannelMessage.status.in_(("pending", "sending"))
    )
    return ~open_file & ~open_job & ~open_message


async def purge_batch(
    session: AsyncSession, *, mailbox: str, retention_days: int, limit: int
) -> BatchReport:
    """Purge up to ``limit`` of the mailbox's mails past retention, in the caller's transaction."""
    candidates = (
        select(InboundMail.id, InboundMail.raw_object_id)
        .join(MailboxCursor, MailboxCursor.id == InboundMail.cursor_id)
        .where(
            MailboxCursor.mailbox == mailbox,
            InboundMail.purged_at.is_(None),
            InboundMail.legal_hold.is_(False),
            InboundMail.status == "final",
            InboundMail.notified_at.is_not(None),
            InboundMail.created_at < db_after(-retention_days * SECONDS_PER_DAY),
            _settled(InboundMail.id),
        )
        .order_by(InboundMail.created_at, InboundMail.id)
        .limit(limit)
        .with_for_update(of=InboundMail, skip_locked=True)
    )
    mails = (await session.execute(candidates)).all()
    if not mails:
        return BatchReport(0, 0, 0, 0)
    mail_ids = [m.id for m in mails]
    files = (
        await session.execute(
            select(StoredFile.id, StoredFile.object_id)
            .where(StoredFile.mail_id.in_(mail_ids))
            .with_for_update()
        )
    ).all()
    file_ids = [f.id for f in files]
    result_ids = list(
        await session.scalars(
            select(RecognitionJob.result_object_id)
            .where(RecognitionJob.file_id.in_(file_ids))
            .where(RecognitionJob.result_object_id.is_not(None))
            .with_for_update()
        )
    )
    await session.execute(
        update(RecognitionJob)
        .where(RecognitionJob.file_id.in_(file_ids))
        .values(result_object_id=None)
    )
    await session.execute(
        update(StoredFile).where(StoredFile.id.in_(file_ids)).values(object_id=None)
    )
    await session.execute(
        update(InboundMail)
        .where(InboundMail.id.in_(mail_ids))
        .values(raw_object_id=None, purged_at=func.now())
    )
    object_ids = [m.raw_object_id for m in mails] + [f.object_id for f in files] + result_ids
    queued = await release_objects(session, object_ids)
    report = BatchReport(len(mails), len(files), len(result_ids), len(queued))
    add_audit_event(
        session,
        actor_type=SYSTEM,
        actor_id=host_pid(),
        action=PURGE_ACTION,
        target=f"mailbox:{mailbox}",
        detail={
            "retention_days": retention_days,
            "mail_ids": mail_ids,
            "mails": report.mails,
            "files": report.files,
            "results": report.results,
            "objects_queued": report.objects_queued,
        },
    )
    return report


async def run_retention_pass(
    sessions: async_sessionmaker[AsyncSession], store: ObjectStore, settings: Settings
) -> RetentionReport:
    """Purge every mailbox's mails past retention, then delete the objects queued long enough.

    Each batch is its own transaction; a pass runs at most ``retention.max_batches`` per
    mailbox (the next pass goes on). Deletions left by a crash, here or in an erase, are
    finished by the second step of any later pass.
    """
    config = settings.retention
    report = RetentionReport()
    # Mailboxes of the environment and of the runtime table, as the poller sees them.
    intake = await effective.intake_settings(
        sessions, settings.intake, settings.runtime_config.key.get_secret_value()
    )
    for mailbox in intake.mailboxes:
        if mailbox.retention_days is None:
            continue
        purged = 0
        for _ in range(config.max_batches):
            async with transaction(sessions) as session:
                batch = await purge_batch(
                    session,
                    mailbox=mailbox.name,
                    retention_days=mailbox.retention_days,
                    limit=config.batch_size,
                )
            purged += batch.mails
            if batch.mails < config.batch_size:
                break
        if purged:
            report.purged[mailbox.name] = purged
            logger.info("Retention purged %d mail(s) of mailbox %s", purged, mailbox.name)
    report.deletion = await delete_queued_objects(sessions, store, grace_s=config.deletion_grace_s)
    if report.deletion.deleted or report.deletion.failed:
        logger.info(
            "Retention deleted %d object(s); %d kept (stored again), %d to retry",
            report.deletion.deleted,
            report.deletion.kept,
            report.deletion.failed,
        )
    return report
