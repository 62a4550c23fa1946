"""Ingest one mail: parse and store its objects, then one fenced transaction of rows.

``prepare_mail`` may run ahead of the mail being committed (it touches only the
content-addressed object store, so a repeat is harmless); ``commit_mail`` runs
strictly in UID order and moves the cursor in the same transaction (one
statement) that stores the mail, its files and their queued recognition jobs.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from mailroom.adapters.imap import FetchedMail
from mailroom.adapters.storage import ObjectStore, StoredRef, content_key
from mailroom.errors import LeaseLost
from mailroom.intake.cursor import Claim, describe_error
from mailroom.intake.mail_sql import FileRow, store_mail
from mailroom.intake.parsing import Limits, ParsedAttachment, ParsedMail, parse_mail

logger = logging.getLogger(__name__)

#: ``created_by`` of the objects intake registers.
CREATED_BY = "intake"


class MailFailed(Exception):
    """One mail could not be ingested; the batch stops at its UID."""

    def __init__(self, uid: int, message_id: str | None, cause: BaseException) -> None:
        super().__init__(f"UID {uid}: {describe_error(cause)[:300]}")
        self.uid = uid
        self.message_id = message_id
        self.cause = cause
        #: UIDVALIDITY of the folder the mail was read from; the batch fills it in.
        self.uidvalidity: int | None = None


@dataclass
class PreparedMail:
    """A parsed mail whose objects are in the store, ready for its transaction."""

    fetched: FetchedMail
    parsed: ParsedMail
    raw_ref: StoredRef | None
    refs: list[StoredRef | None] = field(default_factory=list)


@dataclass(frozen=True)
class Committed:
    uid: int
    mail_id: int | None
    jobs: int
    #: True when the mail was already ingested (same Message-ID and content) and skipped.
    duplicate: bool = False


#: Mails up to this size are parsed on the event loop (a thread hop costs more), in bytes.
INLINE_PARSE_BYTES = 64 * 1024


async def prepare_mail(fetched: FetchedMail, *, store: ObjectStore, limits: Limits) -> PreparedMail:
    """Parse the mail and put the .eml and its attachments into the store.

    Big mails are parsed in a thread so they never stall the lease heartbeat.
    """
    try:
        if len(fetched.raw) <= INLINE_PARSE_BYTES:
            parsed = parse_mail(fetched.raw, limits)
        else:
            parsed = await asyncio.to_thread(parse_mail, fetched.raw, limits)
    except Exception as exc:
        raise MailFailed(fetched.uid, None, exc) from exc
    try:
        raw_ref = await _store_raw(fetched.raw, store) if parsed.problem is None else None
        if len(parsed.attachments) <= 1:
            # No task per put for the common mail: the batch overlaps several mails anyway.
            refs = [await _store_attachment(a, store) for a in parsed.attachments]
        else:
            refs = await _store_all(parsed.attachments, store)
    except Exception as exc:
        raise MailFailed(fetched.uid, parsed.message_id, exc) from exc
    return PreparedMail(fetched, parsed, raw_ref, refs)


async def _store_all(
    attachments: list[ParsedAttachment], store: ObjectStore
) -> list[StoredRef | None]:
    """Put several attachments at once; every put ends before the first error is raised."""
    results = await asyncio.gather(
        *(_store_attachment(a, store) for a in attachments), return_exceptions=True
    )
    for result in results:
        if isinstance(result, BaseException):  # a cancellation stays a cancellation
            raise result
    return [r for r in results if not isinstance(r, BaseException)]


async def _store_raw(raw: bytes, store: ObjectStore) -> StoredRef | None:
    key = content_key(raw, prefix="mail", suffix=".eml")
    return await store.put("mail", key, raw, media_type="message/rfc822")


async def _store_attachment(attachment: ParsedAttachment, store: ObjectStore) -> StoredRef | None:
    if attachment.skip_reason and not attachment.data:
        return None  # over a limit: recorded on its file row, never stored
    suffix = f".{attachment.extension}" if attachment.extension else ""
    key = content_key(attachment.data, prefix="attachments", suffix=suffix)
    return await store.put("incoming", key, attachment.data, media_type=attachment.media_type)


async def commit_mail(
    pg: psycopg.AsyncConnection[Any],
    claim: Claim,
    prepared: PreparedMail,
    *,
    uidvalidity: int,
    now: datetime,
) -> Committed:
    """One transaction: fence on the lease, then the mail, its files and queued jobs.

    ``pg`` is the batch's own autocommit connection; the write is a single
    statement (``mail_sql``), so it is one transaction and one round trip.
    """
    uid = prepared.fetched.uid
    parsed = prepared.parsed
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    raw = prepared.raw_ref
    if raw is not None:
        objects[(raw.bucket, raw.key)] = _object_row(raw, "mail")
    files = []
    for position, (attachment, ref) in enumerate(
        zip(parsed.attachments, prepared.refs, strict=True)
    ):
        if ref is not None:
            objects.setdefault((ref.bucket, ref.key), _object_row(ref, "incoming"))
        recognizable = attachment.pipeline is not None and attachment.skip_reason is None
        files.append(
            FileRow(
                position=position,
                bucket=ref.bucket if ref else None,
                key=ref.key if ref else None,
                original_name=attachment.name,
                file_type=attachment.file_type,
                media_type=attachment.media_type,
                size=attachment.size,
                status="UPLOADED" if recognizable else "SKIPPED",
                status_reason=attachment.skip_reason,
                job_id=uuid.uuid4() if recognizable else None,
                pipeline=attachment.pipeline if recognizable else None,
            )
        )
    stored = await store_mail(
        pg,
        cursor_id=claim.cursor_id,
        lease_id=claim.lease_id,
        uidvalidity=uidvalidity,
        uid=uid,
        mail={
            "message_id": parsed.message_id,
            "sha256": parsed.sha256,
            "sender": parsed.sender,
            "return_path": parsed.return_path,
            "authentication_results": parsed.authentication_results,
            "subject": parsed.subject,
            "internal_date": prepared.fetched.internal_date,
            "problem": parsed.problem,
        },
        raw=(raw.bucket, raw.key) if raw else None,
        # Sorted: a stable row-lock order between batches that share an attachment.
        objects=[objects[k] for k in sorted(objects)],
        files=files,
        created_by=CREATED_BY,
        now=now,
    )
    if not stored.fenced:
        raise LeaseLost(f"mailbox {claim.mailbox}: lease {claim.lease_id} lost before UID {uid}")
    if stored.mail_id is None:
        return Committed(uid, None, 0, duplicate=True)
    return Committed(uid, stored.mail_id, stored.jobs)


def _object_row(ref: StoredRef, role: str) -> dict[str, Any]:
    return {
        "bucket_role": role,
        "bucket": ref.bucket,
        "key": ref.key,
        "size": ref.size,
        "sha256": ref.sha256,
        "media_type": ref.media_type,
    }
