"""An answer wins: a genuine ack or result revives a job dead-lettered for ``NO_ACK``.

The outbox dead-letters a job when no ack came within its no-ack window. That
decision is a guess: the ack may sit in JetStream while every NATS bridge is
down (the recognizer's re-sends under the same ``Nats-Msg-Id`` are dropped as
duplicates, so only the first answer ever arrives). When it does arrive, it is
the truth and the guess is undone: the job takes the answer as if it had never
left ``published``, its file (only while the job is the file's current one)
leaves the ``NO_ACK`` ERROR, and its final mail is reopened, so it is finalized
and notified again under a new final state (the notification dedupe key names
it). An ack revives only before the reply deadline (see ``revivable``); a
result always does. Other final statuses stay final: ``timeout`` means the
service's own deadline passed, and a result or error is already an answer.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import text

from mailroom.recognition.finality import DLQ_STATUS, NO_ACK


def revivable(row: dict[str, Any], now: datetime, *, ack: bool) -> bool:
    """True when this answer takes back a locked job row dead-lettered for want of an ack.

    A result always does. An ack only before the reply deadline: past it the job
    would be ``processing`` where the watchdog times it out on its next run, and
    could do so between the ack and the result behind it in JetStream, turning
    a real answer into a final timeout. Left ``dlq``, the result still revives it.
    """
    if row["status"] != DLQ_STATUS or row["error_code"] != NO_ACK:
        return False
    deadline = row["reply_deadline"]
    return not ack or (deadline is not None and deadline > now)


def revive(row: dict[str, Any], now: datetime) -> None:
    """Undo the dead letter on a locked job row: back to ``published``, the answer applies next.

    The metrics keep a trace (``revived``), so the dead letter stays visible in
    the job's record after its answer replaced it.
    """
    metrics = row["metrics"] if isinstance(row["metrics"], dict) else {}
    row.update(
        status="published",
        finished_at=None,
        error_code=None,
        error_message=None,
        metrics={**metrics, "revived": {"from": DLQ_STATUS, "code": NO_ACK, "at": now.isoformat()}},
    )


# A revived job's file has moved on from the NO_ACK ERROR (the write-back matched it on its
# current job); its mail, final because of that ERROR, waits again for the file to settle.
# Clearing notified_at lets the next finalization notify under its own final state.
#: Run by the inbox's write-back in the same transaction (``inbox_write``).
REOPEN_MAILS = text(
    """
    UPDATE inbound_mail AS m
       SET status = 'stored', finalized_at = NULL, notified_at = NULL
      FROM stored_file AS f
     WHERE f.id = ANY(CAST(:file_ids AS bigint[]))
       AND f.current_recognition_job_id = ANY(CAST(:job_ids AS uuid[]))
       AND m.id = f.mail_id
       AND m.status = 'final'
    """
)
