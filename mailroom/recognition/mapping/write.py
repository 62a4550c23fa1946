"""Writing mapping decisions: a batch of jobs in one transaction, a few statements in all.

The jobs are locked in id order and ``mapped_at`` is re-checked under the lock,
so a redelivered or retried batch, or a sweep mapping the same job beside it,
changes nothing twice. Documents, job marks and file settlements are one
statement for the whole batch (rows passed as JSON arrays); only automatic
retries (``replay_job``) go one by one. The lock statement also returns the
database's ``now()``, so no separate round trip is spent reading the clock.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.recognition import attempts
from mailroom.recognition.contract.violations import CONTRACT_ERROR_CODES
from mailroom.recognition.finality import finalize_mails
from mailroom.recognition.mapping.verdict import (
    MAPPING_ACTOR,
    RESULT_STATUSES,
    Decision,
    MappingOutcome,
)
from mailroom.recognition.replay import replay_job

logger = logging.getLogger("mailroom.recognition.mapping.run")

_LOCK = text(
    """
    SELECT j.id, j.file_id, j.mapped_at, f.mail_id,
           f.current_recognition_job_id = j.id AS is_current, now() AS db_now
      FROM recognition_job AS j
      JOIN stored_file AS f ON f.id = j.file_id
     WHERE j.id = ANY(:ids)
     ORDER BY j.id
       FOR UPDATE OF j
    """
)

# Documents, job marks and file settlements in one statement: data-modifying CTEs all run,
# each on rows of its own table, whether or not the final SELECT reads them.
_WRITE = text(
    """
    WITH documents AS (
        INSERT INTO document (file_id, job_id, document_type, fields, field_confidence,
                              missing_fields, low_confidence_fields, status, created_at)
        SELECT d.file_id, d.job_id, d.document_type, d.fields, d.field_confidence,
               d.missing_fields, d.low_confidence_fields, d.status, :now
          FROM json_to_recordset(CAST(:documents AS json))
               AS d(file_id bigint, job_id uuid, document_type text, fields jsonb,
                    field_confidence jsonb, missing_fields jsonb, low_confidence_fields jsonb,
                    status text)
        ON CONFLICT (job_id) DO NOTHING
        RETURNING id, job_id
    ), marked AS (
        UPDATE recognition_job AS j
           SET mapped_at = :now,
               status = CASE WHEN r.broke_contract THEN 'error' ELSE j.status END,
               error_code = COALESCE(r.error_code, j.error_code),
               error_message = COALESCE(r.error_message, j.error_message)
          FROM json_to_recordset(CAST(:jobs AS json))
               AS r(id uuid, broke_contract boolean, error_code text, error_message text)
         WHERE j.id = r.id
        RETURNING j.id
    ), settled AS (
        UPDATE stored_file AS f
           SET status = r.status, status_reason = r.reason, updated_at = :now
          FROM json_to_recordset(CAST(:files AS json))
               AS r(file_id bigint, job_id uuid, status text, reason text)
         WHERE f.id = r.file_id AND f.current_recognition_job_id = r.job_id
        RETURNING f.id
    )
    SELECT id, job_id FROM documents
    """
)

_EXISTING_DOCUMENTS = text("SELECT id, job_id FROM document WHERE job_id = ANY(:job_ids)")


async def write_decisions(
    sessions: async_sessionmaker[AsyncSession],
    decisions: Sequence[Decision],
    *,
    now: datetime | None = None,
    give_back: str | None = None,
) -> list[MappingOutcome]:
    """Write each decision in one transaction; the outcomes, in the decisions' order.

    With ``give_back`` (an attempts key), the decisions' jobs get that attempt back in the
    same transaction: it came back if the write commits, and stays counted if it does not.
    """
    if not decisions:
        return []
    async with sessions() as session, session.begin():
        locked = {
            row.id: row
            for row in await session.execute(_LOCK, {"ids": [d.job_id for d in decisions]})
        }
        # A job removed since it was loaded (retention) is unknown; one mapped meanwhile is left.
        outcomes = {
            d.job_id: MappingOutcome(
                d.job_id, "already_mapped" if d.job_id in locked else "unknown_job"
            )
            for d in decisions
        }
        todo = [d for d in decisions if d.job_id in locked and locked[d.job_id].mapped_at is None]
        outcomes.update({d.job_id: MappingOutcome(d.job_id, "mapped") for d in todo})
        if todo:
            now = now or locked[todo[0].job_id].db_now
            await _write(session, todo, locked, outcomes, now)
        if give_back is not None:
            # NOTE: only rows the lock above holds, so no lock is taken out of id order.
            await attempts.give_back_in(session, list(locked), give_back)
    ordered = [outcomes[d.job_id] for d in decisions]
    _log([outcome for outcome in ordered if outcome.applied == "mapped"])
    return ordered


async def _write(
    session: AsyncSession,
    todo: Sequence[Decision],
    locked: dict[uuid.UUID, Any],
    outcomes: dict[uuid.UUID, MappingOutcome],
    now: datetime,
) -> None:
    current = [d for d in todo if locked[d.job_id].is_current]
    for decision in todo:
        if not locked[decision.job_id].is_current:
            logger.info("Result of job %s mapped; the file has a newer attempt", decision.job_id)
    settled = [d for d in current if not d.retry]
    documents = [
        {"file_id": locked[d.job_id].file_id, "job_id": str(d.job_id), **d.verdict.document}
        for d in todo
        if d.verdict.document is not None
    ]
    files = [
        {
            "file_id": locked[d.job_id].file_id,
            "job_id": str(d.job_id),
            "status": d.verdict.file_status,
            "reason": d.verdict.reason,
        }
        for d in settled
    ]
    params = {
        "now": now,
        "documents": _json(documents),
        "jobs": _json(_job_rows(todo)),
        "files": _json(files),
    }
    document_ids = {job_id: int(doc_id) for doc_id, job_id in await session.execute(_WRITE, params)}
    # A document already there (ON CONFLICT) is reused: its id is read.
    missing = [
        uuid.UUID(d["job_id"]) for d in documents if uuid.UUID(d["job_id"]) not in document_ids
    ]
    if missing:
        existing = await session.execute(_EXISTING_DOCUMENTS, {"job_ids": missing})
        document_ids.update({job_id: int(doc_id) for doc_id, job_id in existing})
    for job_id, document_id in document_ids.items():
        outcomes[job_id].document_id = document_id
    for decision in current:
        if decision.retry:
            actor_type, actor_id = MAPPING_ACTOR
            outcomes[decision.job_id].replayed = await replay_job(
                session,
                decision.job_id,
                actor_type=actor_type,
                actor_id=actor_id,
                reason=f"automatic retry: {decision.verdict.reason}",
                now=now,
                statuses=RESULT_STATUSES,
            )
            outcomes[decision.job_id].file_status = "UPLOADED"
    if not settled:
        return
    for decision in settled:
        outcomes[decision.job_id].file_status = decision.verdict.file_status
    mails = {locked[d.job_id].mail_id for d in settled} - {None}
    finalized = set(await finalize_mails(session, mails, now=now))
    for decision in settled:  # each mail made final is named once, by its first job here
        mail_id = locked[decision.job_id].mail_id
        if mail_id in finalized:
            finalized.discard(mail_id)
            outcomes[decision.job_id].finalized_mail_ids = [mail_id]
            outcomes[decision.job_id].finalized_mail_id = mail_id


def _job_rows(todo: Sequence[Decision]) -> list[dict[str, Any]]:
    rows = []
    for decision in todo:
        invalid = decision.verdict.invalid_result
        rows.append(
            {
                "id": str(decision.job_id),
                "error_code": invalid.code if invalid else None,
                "error_message": invalid.message if invalid else None,
                # The service's document broke the contract: the job failed, as in the inbox.
                # (Mapping's own failure, MAPPING_ATTEMPTS_EXHAUSTED, keeps the service's status.)
                "broke_contract": bool(invalid and invalid.code in CONTRACT_ERROR_CODES),
            }
        )
    return rows


def _json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows)


def _log(mapped: Sequence[MappingOutcome]) -> None:
    """One INFO line per batch with the counts, a DEBUG line per plainly recognized file.

    As the inbox and delivery log (there an INFO line per item cost the worker about as
    much CPU as the item's work). A file left to check or failed, and an automatic
    retry, keep a line of their own with the job's id.
    """
    # What the file became, or "retried" when a new attempt replaces the job.
    counts: Counter[str] = Counter()
    finals = 0
    for outcome in mapped:
        if outcome.file_status is None:  # mapped for the record: the file has a newer attempt
            continue
        counts["retried" if outcome.replayed else outcome.file_status] += 1
        finals += outcome.finalized_mail_id is not None
        plain = outcome.file_status == "RECOGNIZED" and outcome.replayed is None
        level = logging.DEBUG if plain else logging.INFO
        if not logger.isEnabledFor(level):  # the usual case: no line text built per result
            continue
        logger.log(
            level,
            "Result of job %s mapped: file %s%s%s",
            outcome.job_id,
            outcome.file_status,
            f", retried as {outcome.replayed.new_job_id}" if outcome.replayed else "",
            f", mail {outcome.finalized_mail_id} final" if outcome.finalized_mail_id else "",
        )
    if counts:
        logger.info(
            "Mapping batch: %d result(s) mapped (%s), %d mail(s) final",
            counts.total(),
            ", ".join(f"{what} {n}" for what, n in sorted(counts.items())),
            finals,
        )
