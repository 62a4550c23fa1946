"""Mails as the console shows them: the mail of a file, its body text, its whole story, search.

Read-only, current and past rows alike: the story of a mail is every attempt of every
file, every document and every notification, in the order they happened.
"""

from __future__ import annotations

import email
import email.policy
from dataclasses import dataclass, field
from datetime import datetime
from email.message import EmailMessage
from html.parser import HTMLParser
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.adapters.storage import ObjectStore
from mailroom.errors import AppError

#: Longest body text shown, in characters.
MAX_BODY_CHARS = 100_000
#: Largest stored mail read for its text, in bytes; a larger one shows no body.
MAX_MAIL_BYTES = 25 * 1024 * 1024
#: Most mails a search lists.
SEARCH_LIMIT = 50


@dataclass
class MailView:
    id: int
    mailbox: str | None
    folder: str | None
    message_id: str | None
    sender: str | None
    sender_name: str | None
    subject: str | None
    received_at: datetime | None
    status: str
    finalized_at: datetime | None
    notified_at: datetime | None
    last_error: str | None
    legal_hold: bool
    purged_at: datetime | None
    raw_bucket: str | None
    raw_key: str | None


@dataclass
class Story:
    """A mail and everything that came of it."""

    mail: MailView
    files: list[dict[str, Any]] = field(default_factory=list)
    #: Every attempt of every file, by file id.
    jobs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    documents: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)


_MAIL = """
    SELECT m.id, c.mailbox, c.folder, m.message_id, m.sender, m.sender_name, m.subject,
           COALESCE(m.internal_date, m.created_at) AS received_at, m.status, m.finalized_at,
           m.notified_at, m.last_error, m.legal_hold, m.purged_at,
           o.bucket AS raw_bucket, o.key AS raw_key
      FROM inbound_mail AS m
      LEFT JOIN mailbox_cursor AS c ON c.id = m.cursor_id
      LEFT JOIN stored_object AS o ON o.id = m.raw_object_id
"""


async def mail_by_id(session: AsyncSession, mail_id: int) -> MailView | None:
    row = (await session.execute(text(_MAIL + " WHERE m.id = :id"), {"id": mail_id})).first()
    return MailView(**row._mapping) if row else None


async def mail_story(session: AsyncSession, mail_id: int) -> Story | None:
    """The mail, its files (with their attempts and documents), notifications and audit trail."""
    mail = await mail_by_id(session, mail_id)
    if mail is None:
        return None
    story = Story(mail)
    story.files = await _rows(
        session,
        """SELECT f.id, f.original_name, f.file_type, f.media_type, f.size, f.status,
                  f.status_reason, f.parent_file_id, f.source_path, f.created_at, f.updated_at,
                  f.current_recognition_job_id
             FROM stored_file AS f WHERE f.mail_id = :id ORDER BY f.id""",
        {"id": mail_id},
    )
    for job in await _rows(
        session,
        """SELECT j.file_id, j.id, j.attempt, j.kind, j.status, j.operator_id, j.service_name,
                  j.requested_at, j.published_at, j.started_at, j.finished_at, j.error_code,
                  j.error_message, COALESCE((j.metrics->>'republish_count')::int, 0) AS republishes
             FROM recognition_job AS j JOIN stored_file AS f ON f.id = j.file_id
            WHERE f.mail_id = :id ORDER BY j.file_id, j.attempt""",
        {"id": mail_id},
    ):
        story.jobs.setdefault(job["file_id"], []).append(job)
    for document in await _rows(
        session,
        """SELECT d.file_id, d.id, d.document_type, d.fields, d.missing_fields,
                  d.low_confidence_fields, d.status, d.created_at, j.attempt
             FROM document AS d JOIN stored_file AS f ON f.id = d.file_id
             JOIN recognition_job AS j ON j.id = d.job_id
            WHERE f.mail_id = :id ORDER BY d.id""",
        {"id": mail_id},
    ):
        story.documents.setdefault(document["file_id"], []).append(document)
    story.messages = await _rows(
        session,
        """SELECT id, channel, account, recipient, subject, status, attempts, last_error,
                  created_at, delivered_at, next_retry_at
             FROM channel_message WHERE mail_id = :id ORDER BY id""",
        {"id": mail_id},
    )
    targets = [f"inbound_mail:{mail_id}"] + [f"stored_file:{f['id']}" for f in story.files]
    story.audit = await _rows(
        session,
        """SELECT actor_type, actor_id, action, target, created_at
             FROM audit_event WHERE target = ANY(:targets) ORDER BY id""",
        {"targets": targets},
    )
    return story


async def search_mails(session: AsyncSession, query: str) -> list[MailView]:
    """Mails whose id, Message-ID (with or without its brackets) or sender matches ``query``."""
    given = query.strip()
    if not given:
        return []
    bare = given.strip("<>")
    rows = await session.execute(
        text(
            _MAIL
            + """ WHERE m.id = CAST(:number AS bigint)
                     OR m.message_id IN (CAST(:bare AS text), CAST(:bracketed AS text))
                     OR strpos(lower(m.sender), lower(CAST(:given AS text))) > 0
                  ORDER BY m.id DESC LIMIT :limit"""
        ),
        {
            "number": int(given) if given.isdigit() and len(given) < 18 else None,
            "bare": bare,
            "bracketed": f"<{bare}>",
            "given": given,
            "limit": SEARCH_LIMIT,
        },
    )
    return [MailView(**row._mapping) for row in rows]


async def mail_text(store: ObjectStore, mail: MailView) -> str | None:
    """The mail's body as text (its plain part, else its HTML part's text); None if unreadable."""
    if mail.raw_bucket is None or mail.raw_key is None or mail.purged_at is not None:
        return None
    try:
        if await store.size(mail.raw_bucket, mail.raw_key) > MAX_MAIL_BYTES:
            return None
        raw = await store.get(mail.raw_bucket, mail.raw_key)
    except AppError:
        return None
    return body_text(raw)


def body_text(raw: bytes) -> str | None:
    """The text a reader of ``raw`` would see first, cut to ``MAX_BODY_CHARS``."""
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)  # the default policy builds EmailMessage
    part = parsed.get_body(preferencelist=("plain", "html"))
    if part is None:
        return None
    try:
        content = part.get_content()
    except (LookupError, ValueError):  # an unknown charset, a broken transfer encoding
        return None
    if not isinstance(content, str):
        return None
    if part.get_content_subtype() == "html":
        content = _html_text(content)
    return content[:MAX_BODY_CHARS]


class _TextOnly(HTMLParser):
    """The text of an HTML body: its data, without scripts, styles or markup."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skipping += 1
        elif tag in ("br", "p", "div", "tr", "li"):
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skipping:
            self._skipping -= 1

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def _html_text(html: str) -> str:
    parser = _TextOnly()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts).strip()


async def _rows(session: AsyncSession, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(row._mapping) for row in await session.execute(text(sql), params)]
