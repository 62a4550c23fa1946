"""A data subject's access request: every mail from an address, and what came of it, in a zip.

``export_sender`` writes one zip: each mail as received (``mails/ID.eml``), its files
(``files/MAIL/FILE.ext``: named by id, the sender's file name is in the manifest), its
documents (``documents/ID.json``) and the notifications about it (``notifications/ID.json``),
and ``manifest.json`` listing them with the mail's headers, statuses and dates. A purged
mail (retention removed its objects) is listed without its bytes. The zip is written beside
its path and moved into place, so running it again replaces it whole. One ``intake.export``
audit event records who asked, when, and the ids, naming the address by its SHA-256.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.storage import ObjectStore
from mailroom.db.audit import OPERATOR, add_audit_event
from mailroom.db.clock import db_now
from mailroom.db.engine import transaction
from mailroom.db.models import (
    ChannelMessage,
    Document,
    InboundMail,
    MailboxCursor,
    StoredFile,
    StoredObject,
)
from mailroom.errors import ObjectNotFound
from mailroom.lifecycle.sender import address_target, mail_ids_from, normalized

#: ``action`` of the audit event of an export.
EXPORT_ACTION = "intake.export"
#: ``format`` of the manifest, for whoever reads it later.
MANIFEST_FORMAT = "mailroom-export/1"


@dataclass(frozen=True)
class ExportReport:
    path: Path
    mails: int
    files: int
    documents: int
    notifications: int
    #: Objects listed but not in the zip: purged by retention, or missing from the store.
    missing_objects: int


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _suffix(key: str) -> str:
    suffix = PurePosixPath(key).suffix
    return suffix if suffix[1:].isalnum() else ""


class _Zip:
    """The zip being written: entries, and objects read from the store into it."""

    def __init__(self, archive: zipfile.ZipFile, store: ObjectStore) -> None:
        self.archive, self.store = archive, store
        self.missing = 0

    def json(self, name: str, value: Any) -> str:
        self.archive.writestr(name, json.dumps(value, indent=2, ensure_ascii=False, default=str))
        return name

    async def object(self, name: str, row: StoredObject | None) -> str | None:
        if row is None:
            return None
        try:
            data = await self.store.get(row.bucket, row.key)
        except ObjectNotFound:  # a store that lost it; the manifest says so (null)
            self.missing += 1
            return None
        self.archive.writestr(name, data)
        return name


async def _objects(session: AsyncSession, ids: list[int | None]) -> dict[int, StoredObject]:
    wanted = [i for i in ids if i is not None]
    rows = await session.scalars(select(StoredObject).where(StoredObject.id.in_(wanted)))
    return {row.id: row for row in rows}


async def _files(session: AsyncSession, mail_id: int) -> list[StoredFile]:
    """The mail's files and those extracted from its containers, in id order."""
    found: dict[int, StoredFile] = {}
    frontier = list(await session.scalars(select(StoredFile).where(StoredFile.mail_id == mail_id)))
    while frontier:
        found.update((f.id, f) for f in frontier)
        frontier = list(
            await session.scalars(
                select(StoredFile)
                .where(StoredFile.parent_file_id.in_([f.id for f in frontier]))
                .where(StoredFile.id.not_in(list(found)))
            )
        )
    return [found[i] for i in sorted(found)]


async def _mail_entry(session: AsyncSession, out: _Zip, mail: InboundMail) -> dict[str, Any]:
    cursor = await session.get(MailboxCursor, mail.cursor_id)
    files = await _files(session, mail.id)
    objects = await _objects(session, [mail.raw_object_id, *(f.object_id for f in files)])
    documents = list(
        await session.scalars(
            select(Document)
            .where(Document.file_id.in_([f.id for f in files]))
            .order_by(Document.id)
        )
    )
    messages = await session.scalars(
        select(ChannelMessage)
        .where(
            or_(
                ChannelMessage.mail_id == mail.id,
                ChannelMessage.document_id.in_([d.id for d in documents]),
            )
        )
        .order_by(ChannelMessage.id)
    )
    raw = objects.get(mail.raw_object_id) if mail.raw_object_id else None
    entry: dict[str, Any] = {
        "id": mail.id,
        "mailbox": cursor.mailbox if cursor else None,
        "folder": cursor.folder if cursor else None,
        "uid": mail.uid,
        "message_id": mail.message_id,
        "sender": mail.sender,
        "sender_name": mail.sender_name,
        "return_path": mail.return_path,
        "subject": mail.subject,
        "date": _when(mail.internal_date),
        "received_at": _when(mail.created_at),
        "status": mail.status,
        "purged_at": _when(mail.purged_at),
        "eml": await out.object(f"mails/{mail.id}.eml", raw),
        "files": [],
        "documents": [],
        "notifications": [],
    }
    for file in files:
        stored = objects.get(file.object_id) if file.object_id else None
        name = f"files/{mail.id}/{file.id}{_suffix(stored.key) if stored else ''}"
        entry["files"].append(
            {
                "id": file.id,
                "name": file.original_name,
                "path_in_mail": file.source_path,
                "type": file.file_type,
                "status": file.status,
                "reason": file.status_reason,
                "size": file.size,
                "content": await out.object(name, stored),
            }
        )
    for document in documents:
        body = {
            "id": document.id,
            "file_id": document.file_id,
            "document_type": document.document_type,
            "status": document.status,
            "fields": document.fields,
            "created_at": _when(document.created_at),
        }
        entry["documents"].append(out.json(f"documents/{document.id}.json", body))
    for message in messages:
        body = {
            "id": message.id,
            "channel": message.channel,
            "recipient": message.recipient,
            "subject": message.subject,
            "body": message.body,
            "status": message.status,
            "created_at": _when(message.created_at),
            "delivered_at": _when(message.delivered_at),
        }
        entry["notifications"].append(out.json(f"notifications/{message.id}.json", body))
    return entry


async def export_sender(
    sessions: async_sessionmaker[AsyncSession],
    store: ObjectStore,
    address: str,
    path: Path,
    *,
    operator: str,
) -> ExportReport:
    """Write the zip of everything about the mails from ``address`` to ``path``; audit it."""
    partial = path.with_name(path.name + ".part")
    try:
        async with sessions() as session:
            mail_ids = await mail_ids_from(session, address)
            with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
                out = _Zip(archive, store)
                mails = []
                for mail_id in mail_ids:
                    mail = await session.get(InboundMail, mail_id)
                    if mail is not None:  # erased meanwhile
                        mails.append(await _mail_entry(session, out, mail))
                manifest = {
                    "format": MANIFEST_FORMAT,
                    "sender": normalized(address),
                    "exported_at": _when(await db_now(session)),
                    "exported_by": operator,
                    "mails": mails,
                }
                out.json("manifest.json", manifest)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)  # only left when something failed
    report = ExportReport(
        path=path,
        mails=len(mails),
        files=sum(len(m["files"]) for m in mails),
        documents=sum(len(m["documents"]) for m in mails),
        notifications=sum(len(m["notifications"]) for m in mails),
        missing_objects=out.missing,
    )
    async with transaction(sessions) as session:
        add_audit_event(
            session,
            actor_type=OPERATOR,
            actor_id=operator,
            action=EXPORT_ACTION,
            target=address_target(address),
            detail={
                "mail_ids": [m["id"] for m in mails],
                "files": report.files,
                "documents": report.documents,
                "notifications": report.notifications,
                "missing_objects": report.missing_objects,
            },
        )
    return report
