"""Notifications for final mails: routing rules → channel messages → delivery.

A mail is final when every file of it is settled. Its notifications are
created in one transaction that also stamps ``notified_at`` (so they are made
once per final state), then put on the delivery stream after the commit; a pass
takes up to ``notification_batch_size`` mails in a handful of statements. The
actor runs when mapping finalizes a mail and a scheduler sweep runs it too, so a
crash between the finalizing commit and this step only delays the notification.

Passes are coalesced: whoever wants one sets a Redis mark (``request_pass``) and
sends the actor only if the mark was not set already; a pass clears the mark
before it reads any mail. A mail that became final before a request is therefore
seen by the pass that request found queued (it has not cleared the mark, so it
has not read yet) or by the pass the request sends, while a backlog of final
mails costs one queued pass, not one per mail. A mark left by a process that died
before sending expires after ``PASS_REQUEST_TTL_S``; the sweep runs passes anyway.
A route whose template or configuration raises fails only its own message
(``failed``, ``ROUTE_FAILED`` in ``last_error``), never the pass: the other
routes and mails are notified and the mail is still stamped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.pass_requests import PassRequest
from mailroom.db.engine import transaction
from mailroom.db.models import ChannelMessage
from mailroom.delivery.producer import create_messages, enqueue_messages
from mailroom.notifications import sql as notifications_sql
from mailroom.notifications.senders import shown_sender
from mailroom.recognition.finality import finalize_settled_mails
from mailroom.settings import DeliverySettings, NotificationRoute

logger = logging.getLogger(__name__)

#: Longest field value quoted in a notification, in characters.
MAX_VALUE_CHARS = 200
#: ``last_error`` prefix of a notification whose route could not be rendered.
ROUTE_FAILED = "ROUTE_FAILED"
#: How long a pass request holds off the next ones, in seconds: the longest wait for a
#: pass after a process died between setting the mark and sending the pass.
PASS_REQUEST_TTL_S = 60


@dataclass
class FileSummary:
    name: str
    status: str
    reason: str | None = None
    document_type: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


@dataclass
class MailSummary:
    mail_id: int
    mailbox: str
    uid: int
    subject: str
    #: The addr-spec of From (the sender), and its display name: the mail's claim only.
    sender_address: str | None
    sender_name: str | None
    files: list[FileSummary]
    problem: str | None = None

    @property
    def sender(self) -> str:
        """The sender as notifications show it: ``Display Name <address>``."""
        return shown_sender(self.sender_address, self.sender_name)

    @property
    def document_types(self) -> set[str]:
        return {f.document_type for f in self.files if f.document_type}

    def render(self) -> str:
        lines = [
            f"Mail {self.subject!r} from {self.sender} (mailbox {self.mailbox}, uid {self.uid}).",
        ]
        if self.problem:
            lines.append(f"It was not read: {_short(self.problem)}")
        elif not self.files:
            lines.append("It had no attachments.")
        for item in self.files:
            line = f"- {item.name}: {item.status}"
            if item.document_type:
                line += f" as {item.document_type}"
            if item.fields:
                shown = ", ".join(f"{k}={_short(v)}" for k, v in sorted(item.fields.items()))
                line += f": {shown}"
            if item.missing:
                line += f" (missing: {', '.join(item.missing)})"
            if item.reason and not item.document_type:
                line += f" ({_short(item.reason)})"
            lines.append(line)
        return "\n".join(lines)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def route_matches(route: NotificationRoute, summary: MailSummary) -> bool:
    if route.mailbox not in ("*", summary.mailbox):
        return False
    return route.document_type == "*" or route.document_type in summary.document_types


def render_route(route: NotificationRoute, summary: MailSummary) -> tuple[str, str]:
    """Subject and body of ``route`` for ``summary`` (templates come from settings)."""
    # NOTE: these names are ROUTE_PLACEHOLDERS in settings, which checks templates at load.
    context = {
        "mail_id": summary.mail_id,
        "mailbox": summary.mailbox,
        "uid": summary.uid,
        "mail_subject": summary.subject,
        "sender": summary.sender,
        "sender_address": summary.sender_address or "",
        "sender_name": summary.sender_name or "",
        "document_types": ", ".join(sorted(summary.document_types)) or "none",
        "summary": summary.render(),
    }
    return route.subject.format_map(context), route.template.format_map(context)


async def _summaries(session: AsyncSession, mails: Sequence[Any]) -> list[MailSummary]:
    """The summaries of ``mails`` (rows or ``InboundMail``s with an ``id``), in their order."""
    rows = await session.execute(notifications_sql.SUMMARIES, {"ids": [m.id for m in mails]})
    by_id = {summary.mail_id: summary for summary, _ in _from_rows(rows)}
    return [by_id[mail.id] for mail in mails]


def _from_rows(rows: Iterable[Any]) -> list[tuple[MailSummary, Any]]:
    """Summary rows (``notifications_sql``) → each mail's summary and its row, in row order."""
    mails: dict[int, tuple[MailSummary, Any]] = {}
    for row in rows:
        entry = mails.get(row.mail_id)
        if entry is None:
            summary = MailSummary(
                mail_id=row.mail_id,
                mailbox=row.mailbox or "?",
                uid=row.uid,
                subject=row.subject or "(no subject)",
                sender_address=row.sender,
                sender_name=row.sender_name,
                files=[],
                problem=row.last_error,
            )
            entry = mails[row.mail_id] = (summary, row)
        if row.file_id is None:
            continue
        has_document = row.document_type is not None
        entry[0].files.append(
            FileSummary(
                name=row.original_name,
                status=row.file_status,
                reason=row.status_reason,
                document_type=row.document_type,
                fields=dict(row.fields or {}) if has_document else {},
                missing=list(row.missing_fields or []) if has_document else [],
            )
        )
    return list(mails.values())


@dataclass
class NotificationBatch:
    message_ids: list[int] = field(default_factory=list)
    mails: int = 0


async def create_notifications(
    session: AsyncSession,
    *,
    routes: Sequence[NotificationRoute],
    now: datetime | None = None,
    limit: int = 100,
) -> NotificationBatch:
    """Create the messages of up to ``limit`` final, un-notified mails.

    Runs in the caller's transaction. Mails are claimed with SKIP LOCKED so two
    runs never notify one mail twice; the dedupe key (mail, final state, route)
    makes a repeat after a crash a no-op. ``notified_at`` is ``now``, or the
    database's ``now()`` (read by the claiming statement itself) when not given.
    One statement claims, stamps and reads the mails, one inserts their messages.
    """
    claimed = _from_rows(
        await session.execute(notifications_sql.CLAIM, {"limit": limit, "now": now})
    )
    batch = NotificationBatch(mails=len(claimed))
    if not claimed:
        return batch
    values: list[dict[str, Any]] = []
    for summary, row in claimed:
        state = int((row.finalized_at or row.notified_at).timestamp() * 1000)
        for number, route in enumerate(routes):
            key = f"mail:{summary.mail_id}:final:{state}:route:{number}"
            try:  # settings check templates at load; what still raises is this route's alone
                if not route_matches(route, summary):
                    continue
                subject, body = render_route(route, summary)
            except Exception as exc:
                await _record_route_failure(session, route, number, summary.mail_id, key, exc)
                continue
            values.append(
                {
                    "channel": route.channel,
                    "account": route.account,
                    "recipient": route.recipient,
                    "subject": subject,
                    "body": body,
                    "dedupe_key": key,
                    "mail_id": summary.mail_id,
                }
            )
    batch.message_ids = await create_messages(session, values)
    logger.info(
        "Created %d notification(s) for %d final mail(s)", len(batch.message_ids), len(claimed)
    )
    return batch


async def _record_route_failure(
    session: AsyncSession,
    route: NotificationRoute,
    number: int,
    mail_id: int,
    key: str,
    exc: Exception,
) -> None:
    """A ``failed`` message for the route, so the failure is visible where messages are."""
    error = f"{ROUTE_FAILED}: route {number}: {type(exc).__name__}: {_short(exc)}"
    logger.error("Notification of mail %d: %s", mail_id, error)
    await session.execute(
        insert(ChannelMessage)
        .values(
            channel=str(getattr(route, "channel", "?"))[:50],
            account=str(getattr(route, "account", "default"))[:100],
            recipient=str(getattr(route, "recipient", "?")),
            body="",
            status="failed",
            last_error=error,
            dedupe_key=key,
            mail_id=mail_id,
        )
        .on_conflict_do_nothing(index_elements=["dedupe_key"])
    )


def pass_request_key(settings: DeliverySettings) -> str:
    """The Redis key of the mark that a notification pass is wanted (one per stream)."""
    return f"{settings.stream_key}:notify-pass-requested"


def _pass_request(settings: DeliverySettings) -> PassRequest:
    return PassRequest(pass_request_key(settings), PASS_REQUEST_TTL_S, "Notification pass")


async def request_pass(redis: aioredis.Redis, settings: DeliverySettings) -> bool:
    """Mark a pass as wanted; True when the caller must send one (none is waiting to start).

    When Redis cannot be asked, True: a pass too many costs less than a mail left waiting.
    """
    return await _pass_request(settings).request(redis)


def settle_request_key(settings: DeliverySettings) -> str:
    """The Redis key of the mark that a pass should finalize settled stored mails."""
    return f"{settings.stream_key}:notify-settle-requested"


async def request_settle(redis: aioredis.Redis, settings: DeliverySettings) -> bool:
    """Mark that the next pass finalizes settled stored mails; False when Redis cannot be
    told (the caller then sends a pass that settles)."""
    try:
        await redis.set(settle_request_key(settings), "1", ex=PASS_REQUEST_TTL_S)
    except RedisError as exc:
        logger.warning("Notification settle request not recorded: %s", exc)
        return False
    return True


async def _settle_requested(redis: aioredis.Redis, settings: DeliverySettings) -> bool:
    """Take the settle mark: True when it was set, or when Redis cannot be asked."""
    try:
        return bool(await redis.delete(settle_request_key(settings)))
    except RedisError as exc:
        logger.warning("Notification settle request not read (%s); settling", exc)
        return True


async def notify_final_mails(
    *,
    sessions: async_sessionmaker[AsyncSession],
    redis: aioredis.Redis,
    settings: DeliverySettings,
    limit: int | None = None,
    settle: bool = True,
) -> tuple[list[int], bool]:
    """One pass: finalize settled mails, create notifications, commit, put them on the stream.

    At most ``limit`` mails (``notification_batch_size``) per pass, so a backlog
    is worked off in bounded transactions. Returns the new message ids and
    whether more mails may be waiting.

    Settled stored mails (no file to recognize, or a crash before their finisher's
    check) are looked for when ``settle`` or when the settle mark was set: a pass
    asked for by a finisher that made its mails final itself skips that scan of
    every stored mail.
    """
    limit = limit or settings.notification_batch_size
    # NOTE: before any read, so a mail made final by a request that found the mark set is seen.
    await _pass_request(settings).started(redis)
    # NOTE: after the pass mark, so a settle request whose pass request found that mark set
    # is taken by this pass.
    settle = await _settle_requested(redis, settings) or settle
    settled_all = True
    async with transaction(sessions) as session:
        if settle:
            settled_all = len(await finalize_settled_mails(session, limit=limit)) < limit
        batch = await create_notifications(session, routes=settings.routes, limit=limit)
    await enqueue_messages(batch.message_ids, redis=redis, sessions=sessions, settings=settings)
    if not settled_all:  # more settled mails may wait: the next pass looks again
        await request_settle(redis, settings)
    return batch.message_ids, batch.mails >= limit or not settled_all
