"""A data subject's request by address: erase every mail from a sender.

The mails are those whose sender (the From addr-spec) is the address, compared without
regard to case. Each is erased as ``erase_mail`` erases one, in its own transaction, so a
failure part way leaves the mails before it erased and the request can be run again; a mail
on legal hold is kept and counted. One ``intake.erase_sender`` audit event sums it up; it
names the address by its SHA-256 only, so the trail does not keep what was erased.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.storage import ObjectStore
from mailroom.db.audit import OPERATOR, add_audit_event
from mailroom.db.engine import transaction
from mailroom.db.models import InboundMail
from mailroom.errors import MailOnLegalHold
from mailroom.lifecycle.erase import erase_mail

#: ``action`` of the audit event of an erasure by sender.
ERASE_SENDER_ACTION = "intake.erase_sender"


def address_target(address: str) -> str:
    """The audit target of a request about ``address``: its SHA-256, not the address."""
    digest = hashlib.sha256(normalized(address).encode()).hexdigest()
    return f"sender:sha256:{digest}"


def normalized(address: str) -> str:
    return address.strip().lower()


async def mail_ids_from(session: AsyncSession, address: str) -> list[int]:
    """The ids of the mails whose sender is ``address`` (any case), oldest first."""
    rows = await session.scalars(
        select(InboundMail.id)
        .where(func.lower(InboundMail.sender) == normalized(address))
        .order_by(InboundMail.id)
    )
    return list(rows)


@dataclass
class SenderEraseReport:
    mails: int = 0
    files: int = 0
    jobs: int = 0
    documents: int = 0
    channel_messages: int = 0
    audit_rows_scrubbed: int = 0
    objects_deleted: int = 0
    #: Objects the store refused to delete this time (queued for the retention pass).
    objects_failed: int = 0
    #: Mails kept because they are on legal hold.
    held: list[int] = field(default_factory=list)


async def erase_sender(
    sessions: async_sessionmaker[AsyncSession],
    store: ObjectStore,
    address: str,
    *,
    operator: str,
) -> SenderEraseReport:
    """Erase every mail from ``address`` but those on legal hold; safe to run again."""
    async with sessions() as session:
        mail_ids = await mail_ids_from(session, address)
    report = SenderEraseReport()
    erased: list[int] = []
    for mail_id in mail_ids:
        try:
            one = await erase_mail(sessions, store, mail_id, operator=operator)
        except MailOnLegalHold:
            report.held.append(mail_id)
            continue
        if not one.erased:  # erased meanwhile by someone else
            continue
        erased.append(mail_id)
        report.mails += 1
        report.files += one.files
        report.jobs += one.jobs
        report.documents += one.documents
        report.channel_messages += one.channel_messages
        report.audit_rows_scrubbed += one.audit_rows_scrubbed
        if one.deletion is not None:
            report.objects_deleted += one.deletion.deleted
            report.objects_failed += one.deletion.failed
    async with transaction(sessions) as session:
        add_audit_event(
            session,
            actor_type=OPERATOR,
            actor_id=operator,
            action=ERASE_SENDER_ACTION,
            target=address_target(address),
            detail={
                "mail_ids": erased,
                "held_mail_ids": report.held,
                "files": report.files,
                "documents": report.documents,
                "channel_messages": report.channel_messages,
                "objects_deleted": report.objects_deleted,
            },
        )
    return report
