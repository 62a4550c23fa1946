"""The transactional outbox: queued jobs become NATS requests (ARCHITECTURE.md).

One pass is one short transaction: claim up to N candidate rows with
``FOR UPDATE SKIP LOCKED`` (parallel publishers never take the same row), hand
every request to the publisher, wait for one confirmation of the whole batch
(a flush, or JetStream acks), then update the rows in a few set-based
statements and commit. The row locks live only for that round trip; an ack
that arrives meanwhile waits on the lock and applies after the commit.

Flow control: per pipeline at most ``max_unacked_per_pipeline`` requests are
``published`` (sent, not yet acked or answered); the other jobs wait ``queued``, so
a backlog never waits unacked in front of a slower service until its republishes
run out (``dlq``/``NO_ACK``). Each pass counts the window and claims at most its
free places of queued jobs; republishes are inside the window already. The count
takes no lock: passes in parallel each see the same free places and SKIP LOCKED
gives them different jobs, so ``p`` overlapping passes can publish ``p`` times
what was free (at most ``(p - 1) x min(window, batch)`` above the window), and the
next passes publish nothing until acks bring it back under. Inbox batches that
ack or answer jobs run the publisher again (window.py).

Republish number k is due ``k * ack_timeout`` after the first publish
(``published_at`` keeps the first publish; ``metrics.republish_count`` counts).
A crash after publishing and before the commit leaves the rows as they were:
the next pass publishes them again under the same ``Nats-Msg-Id``, which
JetStream's duplicate window drops and services dedupe on.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.nats import OutgoingMessage, PublishAck, RequestPublisher
from mailroom.db.models import PIPELINES
from mailroom.db.params import text_array, uuid_array
from mailroom.recognition.contract.models import request_msg_id
from mailroom.recognition.finality import (
    DLQ_STATUS,
    MAX_REASON_CHARS,
    NO_ACK,
    fail_current_files,
    finalize_mails,
)
from mailroom.recognition.outbox import sql as outbox_sql
from mailroom.recognition.outbox.declared import declared_types_param
from mailroom.recognition.outbox.requests import RequestWriter
from mailroom.recognition.outbox.sql import ClaimedJob
from mailroom.settings import NatsSettings, RecognitionSettings

logger = logging.getLogger(__name__)


@dataclass
class OutboxPass:
    """What one pass did; ``more`` asks the caller to run another pass now."""

    skipped: bool = False
    claimed: int = 0
    published: list[uuid.UUID] = field(default_factory=list)
    republished: list[uuid.UUID] = field(default_factory=list)
    #: Held jobs sent again as the gate's probe; no republish is counted for them.
    probed: list[uuid.UUID] = field(default_factory=list)
    #: Publishes JetStream reported as duplicates (already in the stream).
    duplicates: int = 0
    dead_lettered: list[uuid.UUID] = field(default_factory=list)
    invalid: list[uuid.UUID] = field(default_factory=list)
    #: Jobs whose publish failed; rolled back, so they stay candidates.
    failed: list[uuid.UUID] = field(default_factory=list)
    error: str | None = None
    finalized_mail_ids: list[int] = field(default_factory=list)
    limit: int = 0
    #: Pipelines whose window this pass found or left full: queued jobs may wait behind it.
    window_full: list[str] = field(default_factory=list)

    @property
    def more(self) -> bool:
        if self.skipped or self.error is not None:
            return False
        # A dead letter or an invalid request leaves a place a waiting job can take now.
        freed = bool(self.window_full and (self.dead_lettered or self.invalid))
        return self.claimed >= self.limit > 0 or freed


def request_subject(nats: NatsSettings, pipeline: str) -> str:
    name = nats.tabular_subject if pipeline == "tabular" else nats.image_subject
    return nats.subject(name)


def _describe(exc: ValidationError) -> str:
    parts = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]]
    return ("invalid request: " + "; ".join(parts))[:MAX_REASON_CHARS]


async def publish_recognition_requests(
    sessions: async_sessionmaker[AsyncSession],
    publisher: RequestPublisher,
    *,
    nats: NatsSettings,
    recognition: RecognitionSettings,
    now: datetime | None = None,
    limit: int | None = None,
    held: Collection[str] = (),
) -> OutboxPass:
    """Run one outbox pass over at most ``limit`` (default: the batch size setting) jobs.

    ``held``: pipelines whose health gate is closed (gate.py): their queued jobs are published,
    but of their waiting ones only the oldest is sent again (a probe), no republish counted.
    """
    limit = limit or recognition.publish_batch_size
    outcome = OutboxPass(limit=limit)
    if not publisher.is_connected:
        logger.warning("Outbox pass skipped: no NATS connection")
        outcome.skipped = True
        return outcome
    async with sessions() as session, session.begin():
        jobs, free, db_now = await _claim(session, recognition, now=now, limit=limit, held=held)
        outcome.claimed = len(jobs)
        outcome.window_full = _full_windows(jobs, free)
        probes: set[uuid.UUID] = set()
        for pipeline in sorted(held):
            probed = await session.execute(outbox_sql.PROBE, {"pipeline": pipeline})
            for job in outbox_sql.claimed_jobs(*outbox_sql.read_rows(probed)):
                jobs.append(job)
                probes.add(job.id)
        if jobs:
            await _publish(
                session, publisher, jobs, probes, outcome, nats, recognition, now or db_now
            )

    _log(outcome)
    return outcome


async def _claim(
    session: AsyncSession,
    recognition: RecognitionSettings,
    *,
    now: datetime | None,
    limit: int,
    held: Collection[str],
) -> tuple[list[ClaimedJob], dict[str, int], datetime]:
    """The claimed jobs, oldest first, the free places of each pipeline's window, and the
    database's time."""
    params = {
        "now": now,
        "ack_timeout_s": recognition.ack_timeout_s,
        "limit": limit,
        "held": sorted(held),
        "window": recognition.max_unacked_per_pipeline,
        "pipelines": list(PIPELINES),
        "types": declared_types_param(recognition, PIPELINES),
    }
    columns, rows = outbox_sql.read_rows(await session.execute(outbox_sql.CLAIM, params))
    # Every pipeline brings a row, with a job or not: its window's free places.
    at_pipeline, at_free = columns["window_pipeline"], columns["free"]
    free = {row[at_pipeline]: row[at_free] for row in rows}
    return outbox_sql.claimed_jobs(columns, rows), free, rows[0][columns["db_now"]]


def _full_windows(jobs: list[ClaimedJob], free: dict[str, int]) -> list[str]:
    """Pipelines whose queued claim the window cut short (or that had no place at all)."""
    first = Counter(job.pipeline for job in jobs if job.status == "queued")
    return sorted(pipeline for pipeline, places in free.items() if first[pipeline] >= places)


async def _publish(
    session: AsyncSession,
    publisher: RequestPublisher,
    rows: list[ClaimedJob],
    probes: set[uuid.UUID],
    outcome: OutboxPass,
    nats: NatsSettings,
    recognition: RecognitionSettings,
    now: datetime,
) -> None:
    """Build, publish and record the claimed rows, in the pass's transaction."""
    first_deadline = now + timedelta(seconds=recognition.reply_deadline_s)
    writer = RequestWriter()
    subjects: dict[str, str] = {}
    messages: list[OutgoingMessage] = []
    sending: list[tuple[ClaimedJob, bool, str]] = []  # (row, is_republish, job id as text)
    invalid_messages: list[str] = []
    for row in rows:
        republish = row.status == "published"
        # NOTE: a probe is never dead-lettered (the gate holds it until a service answers)
        # and promises the deadline that the reopening gate gives every held job.
        probe = bool(probes) and row.id in probes  # a UUID hashes in Python: only when held
        if republish and not probe and row.republish_count >= recognition.max_republish:
            outcome.dead_lettered.append(row.id)
            continue
        deadline = row.reply_deadline if republish and not probe else first_deadline
        subject = (republish and row.request_subject) or subjects.get(row.pipeline)
        if not subject:
            subject = subjects[row.pipeline] = request_subject(nats, row.pipeline)
        key = str(row.id)  # once: the body, the msg id and the id array all carry it
        try:
            body = writer.body(row, key, deadline)
        except ValidationError as exc:
            outcome.invalid.append(row.id)
            invalid_messages.append(_describe(exc))
            continue
        messages.append(OutgoingMessage(subject, body, request_msg_id(key, row.attempt)))
        sending.append((row, republish, key))

    results = await publisher.publish_batch(messages) if messages else []

    first_keys: list[str] = []
    first_msg_ids: list[str] = []
    first_subjects: list[str] = []
    for (row, republish, key), message, result in zip(sending, messages, results, strict=True):
        if not isinstance(result, PublishAck):
            # NOTE: this job is left as it was; the pass ends after this batch.
            outcome.failed.append(row.id)
            outcome.error = outcome.error or f"{type(result).__name__}: {result}"
            continue
        outcome.duplicates += result.duplicate
        if probes and row.id in probes:
            outcome.probed.append(row.id)
        elif republish:
            outcome.republished.append(row.id)
        else:
            outcome.published.append(row.id)
            first_keys.append(key)
            first_msg_ids.append(message.msg_id)
            first_subjects.append(message.subject)

    if first_keys:
        await session.execute(
            outbox_sql.MARK_PUBLISHED,
            {
                "now": now,
                "deadline": first_deadline,
                "ids": uuid_array(first_keys),  # the ids already written as text
                "msg_ids": text_array(first_msg_ids),
                "subjects": text_array(first_subjects),
            },
        )
    if outcome.republished:
        await session.execute(outbox_sql.MARK_REPUBLISHED, {"ids": uuid_array(outcome.republished)})
    mail_ids: set[int] = set()
    if outcome.dead_lettered:
        reason = f"no ack after {recognition.max_republish} republishes"
        # A guess, not an answer: an ack or result that arrives later revives the job.
        await _mark_failed(session, outcome.dead_lettered, DLQ_STATUS, NO_ACK, reason, now)
        mail_ids |= await fail_current_files(
            session, outcome.dead_lettered, reason=f"{NO_ACK}: {reason}", now=now
        )
    if outcome.invalid:
        await _mark_failed(
            session, outcome.invalid, "error", "INVALID_REQUEST", invalid_messages, now
        )
        mail_ids |= await fail_current_files(
            session, outcome.invalid, reason="INVALID_REQUEST", now=now
        )
    outcome.finalized_mail_ids = await finalize_mails(session, mail_ids, now=now)


async def _mark_failed(
    session: AsyncSession,
    ids: list[uuid.UUID],
    status: str,
    code: str,
    messages: str | list[str],
    now: datetime,
) -> None:
    texts = [messages] * len(ids) if isinstance(messages, str) else messages
    await session.execute(
        outbox_sql.MARK_FAILED,
        {"ids": ids, "messages": texts, "status": status, "code": code, "now": now},
    )


def _log(outcome: OutboxPass) -> None:
    for job_id in outcome.dead_lettered:
        logger.warning("Recognition job %s dead-lettered: no ack (NO_ACK)", job_id)
    for job_id in outcome.invalid:
        logger.warning(
            "Recognition job %s failed: request cannot be built (INVALID_REQUEST)", job_id
        )
    if outcome.error is not None:
        logger.warning(
            "Outbox pass ended by a publish error after %d of %d jobs (%d rolled back): %s",
            len(outcome.published) + len(outcome.republished),
            outcome.claimed,
            len(outcome.failed),
            outcome.error[:200],
        )
    elif outcome.claimed:
        logger.info(
            "Outbox pass: %d published, %d republished, %d probed (%d duplicates), %d dlq,"
            " %d invalid; full windows: %s",
            len(outcome.published),
            len(outcome.republished),
            len(outcome.probed),
            outcome.duplicates,
            len(outcome.dead_lettered),
            len(outcome.invalid),
            ", ".join(outcome.window_full) or "none",
        )
