"""Ingest mails in groups: parse and store their objects, then one transaction per mail.

``prepare_group`` may run ahead of the mails being committed (it touches only
the content-addressed object store, so a repeat is harmless) and stops at the
first mail it cannot prepare; ``commit_group`` runs strictly in UID order: each
mail is its own fenced transaction (mail, files, queued recognition jobs and the
cursor advance), and a group's transactions travel to Postgres together.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from mailroom.adapters.imap import FetchedMail
from mailroom.adapters.storage import ObjectStore, PutRequest, StoredRef, digest_key, sha256_hex
from mailroom.errors import LeaseLost, MailFailed
from mailroom.intake.cursor import Claim
from mailroom.intake.mail_sql import FileRow, MailWrite, store_mails
from mailroom.intake.parsing import (
    Limits,
    ParsedAttachment,
    ParsedMail,
    parse_mail,
    parse_oversize,
)
from mailroom.intake.stored_mail import stored_mail
from mailroom.intake.tombstones import message_id_digest

logger = logging.getLogger(__name__)

#: ``created_by`` of the objects intake registers.
CREATED_BY = "intake"

#: For each (content SHA-256, Message-ID) of a group: whether an erased mail matches it.
ErasedCheck = Callable[[Sequence[tuple[str, str | None]]], Awaitable[list[bool]]]


@dataclass
class PreparedMail:
    """A parsed mail whose objects are in the store, ready for its transaction."""

    fetched: FetchedMail
    parsed: ParsedMail
    raw_ref: StoredRef | None
    refs: list[StoredRef | None] = field(default_factory=list)
    #: An erased mail read again: nothing of it was stored, nothing will be.
    erased: bool = False


@dataclass
class PreparedGroup:
    """Consecutive mails ready to commit, and why the next one is not, if it is not."""

    mails: list[PreparedMail]
    failure: MailFailed | None = None


@dataclass
class GroupCommit:
    """The mails of a group that committed, in order, and what stopped the rest."""

    committed: list[Committed]
    #: ``LeaseLost`` or ``MailFailed`` for the first mail that did not commit, else None.
    error: LeaseLost | MailFailed | None = None
    #: Objects stored for mails their statement found erased (an erase that committed while
    #: they were prepared): to delete unless another mail registered them.
    orphaned: list[StoredRef] = field(default_factory=list)


@dataclass(frozen=True)
class Committed:
    uid: int
    mail_id: int | None
    jobs: int
    #: True when the mail was already ingested (same Message-ID and content) and skipped.
    duplicate: bool = False
    #: True when the mail matched an erased mail's tombstone and was skipped.
    erased: bool = False


#: Mails up to this size are parsed on the event loop (a thread hop costs more), in bytes.
INLINE_PARSE_BYTES = 64 * 1024


async def prepare_group(
    fetched: list[FetchedMail],
    *,
    store: ObjectStore,
    limits: Limits,
    erased: ErasedCheck | None = None,
) -> PreparedGroup:
    """Parse the mails and put their .eml files and attachments into the store.

    All objects of the group go to the store in one ``put_many``. Big mails are
    parsed in a thread so they never stall the lease heartbeat. A mail ``erased`` knows
    (``intake.tombstones``) puts nothing into the store.
    """
    parsed: list[tuple[FetchedMail, ParsedMail]] = []
    failure: MailFailed | None = None
    for mail in fetched:
        try:
            if mail.headers_only:  # over max_mail_bytes: recorded from its headers, no body
                parsed.append((mail, parse_oversize(mail.raw, mail.size, limits)))
            elif len(mail.raw) <= INLINE_PARSE_BYTES:
                parsed.append((mail, parse_mail(mail.raw, limits)))
                # Let the commit of an earlier group go on between mails: parsing a whole
                # group in one go held its results back and left Postgres idle meanwhile.
                await asyncio.sleep(0)
            else:
                parsed.append((mail, await asyncio.to_thread(parse_mail, mail.raw, limits)))
        except Exception as exc:
            failure = MailFailed(mail.uid, None, exc)
            break
    known = [False] * len(parsed)
    if erased is not None and parsed:
        known = await erased([(p.sha256, p.message_id) for _, p in parsed])
    requests: list[PutRequest] = []
    #: For each request: the mail it belongs to and its attachment (None for the .eml).
    owners: list[tuple[int, int | None]] = []
    for index, (mail, p) in enumerate(parsed):
        if known[index]:
            continue
        if p.problem is None:  # parsed whole: ``p.sha256`` is the hash of ``mail.raw``
            trimmed = stored_mail(mail.raw, p.attachments)
            data, digest = (
                (mail.raw, p.sha256) if trimmed is None else (trimmed, sha256_hex(trimmed))
            )
            key = digest_key(digest, prefix="mail", suffix=".eml")
            requests.append(PutRequest("mail", key, data, "message/rfc822", digest))
            owners.append((index, None))
        for position, attachment in enumerate(p.attachments):
            if request := _attachment_request(attachment):
                requests.append(request)
                owners.append((index, position))
    outcomes = await store.put_many(requests) if requests else []
    prepared = [
        PreparedMail(_drop_bytes(mail, p), p, None, [None] * len(p.attachments), gone)
        for (mail, p), gone in zip(parsed, known, strict=True)
    ]
    ready = len(prepared)
    for (owner, part), outcome in zip(owners, outcomes, strict=True):
        if isinstance(outcome, Exception):
            if owner < ready:  # the first mail with an object that failed ends the group
                ready = owner
                failure = MailFailed(
                    prepared[owner].fetched.uid, prepared[owner].parsed.message_id, outcome
                )
                failure.__cause__ = outcome
        elif part is None:
            prepared[owner].raw_ref = outcome
        else:
            prepared[owner].refs[part] = outcome
    return PreparedGroup(prepared[:ready], failure)


def _drop_bytes(mail: FetchedMail, parsed: ParsedMail) -> FetchedMail:
    """``mail`` without its bytes, and ``parsed`` without its files' bytes: they are stored.

    A prepared group waits for the groups before it to commit, and the commit needs none of
    the bytes: a big mail's memory goes as soon as its objects are in the store.
    """
    for attachment in parsed.attachments:
        attachment.data = b""
    return replace(mail, raw=b"")


def _attachment_request(attachment: ParsedAttachment) -> PutRequest | None:
    if attachment.skip_reason and not attachment.data:
        return None  # over a limit: recorded on its file row, never stored
    # The decided type, not the sender's name: a CSV named .pdf is stored as .csv.
    file_type = attachment.file_type
    suffix = f".{file_type}" if file_type != "unknown" and file_type.isalnum() else ""
    digest = sha256_hex(attachment.data)
    key = digest_key(digest, prefix="attachments", suffix=suffix)
    return PutRequest("incoming", key, attachment.data, attachment.media_type, digest)


async def commit_group(
    pg: psycopg.AsyncConnection[Any],
    claim: Claim,
    group: list[PreparedMail],
    *,
    uidvalidity: int,
) -> GroupCommit:
    """Commit the mails in order, each its own fenced transaction, in one round trip.

    ``pg`` is the batch's own autocommit connection. The outcome stops at the
    first mail the lease no longer covers (``LeaseLost``) or that Postgres
    refused (``MailFailed``); the mails before it stay committed.
    """
    writes = [_mail_write(claim, prepared, uidvalidity=uidvalidity) for prepared in group]
    results, error = await store_mails(pg, writes)
    outcome = GroupCommit([])
    for prepared, stored in zip(group, results, strict=False):
        uid = prepared.fetched.uid
        if not stored.fenced:
            # Its transaction and those after it wrote nothing: each is fenced on the lease.
            outcome.error = LeaseLost(
                f"mailbox {claim.mailbox}: lease {claim.lease_id} lost before UID {uid}"
            )
            return outcome
        if stored.erased:
            outcome.committed.append(Committed(uid, None, 0, erased=True))
            refs = [prepared.raw_ref, *prepared.refs]
            outcome.orphaned += [ref for ref in refs if ref is not None]
        elif stored.mail_id is None:
            outcome.committed.append(Committed(uid, None, 0, duplicate=True))
        else:
            outcome.committed.append(Committed(uid, stored.mail_id, stored.jobs))
    if error is not None:
        failed = group[len(results)]
        outcome.error = MailFailed(failed.fetched.uid, failed.parsed.message_id, error)
        outcome.error.__cause__ = error
    return outcome


def _mail_write(claim: Claim, prepared: PreparedMail, *, uidvalidity: int) -> MailWrite:
    parsed = prepared.parsed
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    raw = prepared.raw_ref
    if raw is not None:
        objects[(raw.bucket, raw.key)] = _object_row(raw, "mail")
    files = []
    # An erased mail's statement only moves the cursor past it: no object, no file.
    attachments = [] if prepared.erased else parsed.attachments
    for position, (attachment, ref) in enumerate(
        zip(attachments, prepared.refs[: len(attachments)], strict=True)
    ):
        if ref is not None:
            objects.setdefault((ref.bucket, ref.key), _object_row(ref, "incoming"))
        recognizable = attachment.pipeline is not None and attachment.skip_reason is None
        status, reason = "UPLOADED" if recognizable else "SKIPPED", attachment.skip_reason
        if attachment.check_reason is not None:
            status, reason = "NEEDS_CHECK", attachment.check_reason
        elif attachment.container_reason is not None:
            status, reason = "CONTAINER", attachment.container_reason
        files.append(
            FileRow(
                position=position,
                bucket=ref.bucket if ref else None,
                key=ref.key if ref else None,
                original_name=attachment.name,
                file_type=attachment.file_type,
                media_type=attachment.media_type,
                size=attachment.size,
                status=status,
                status_reason=reason,
                job_id=uuid.uuid4() if recognizable else None,
                pipeline=attachment.pipeline if recognizable else None,
                parent_position=attachment.parent,
                source_path=attachment.path or attachment.name,
                type_rule=attachment.type_rule,
            )
        )
    return MailWrite(
        cursor_id=claim.cursor_id,
        lease_id=claim.lease_id,
        uidvalidity=uidvalidity,
        uid=prepared.fetched.uid,
        mail={
            "message_id": parsed.message_id,
            "message_id_sha256": message_id_digest(parsed.message_id),
            "erased": prepared.erased,
            "sha256": parsed.sha256,
            "sender": parsed.sender,
            "sender_name": parsed.sender_name,
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
    )


def _object_row(ref: StoredRef, role: str) -> dict[str, Any]:
    return {
        "bucket_role": role,
        "bucket": ref.bucket,
        "key": ref.key,
        "size": ref.size,
        "sha256": ref.sha256,
        "media_type": ref.media_type,
    }
