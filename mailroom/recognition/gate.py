"""The recognition health gate: while no service answers, jobs wait instead of burning out.

Without it, a recognition service that is down (or NATS that cannot be reached)
turns every waiting job into ``dlq``/``NO_ACK`` after its republishes, and every
acked one into ``timeout``: intake's files end ERROR for an outage, not for a
fault of theirs. The gate of a pipeline is *closed* while NATS is unreachable;
while answers wait unread in the inbox's JetStream consumer and no NATS bridge has
taken one for ``nats.bridge_ack_wait_s`` (the bridge is down or stuck: the service
answered, Mailroom has not read it); or while one of its requests has waited
``silence_after_s`` unacked and no service of that pipeline answered (an ack or a
result) within that time. While closed,
the outbox still publishes first requests (a returning service finds them in
JetStream) but neither republishes nor dead-letters that pipeline's jobs, and
the watchdog times none of them out.

The decision is computed from the jobs each time (DB clock), never stored as
truth. The ``recognition_gate`` row only remembers when it closed and why, so
the process whose conditional update wins reports the close once (a WARNING and
one Sentry event) and, on the first check that finds a service answering again,
refreshes the held jobs once (a fresh reply deadline and a fresh no-ack window)
and logs the reopening.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import Gauge
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.nats.backlog import InboxBacklog
from mailroom.db.clock import db_now
from mailroom.db.models import PIPELINES
from mailroom.process.observability import active_sentry
from mailroom.recognition.finality import object_metrics_sql, republish_count_sql
from mailroom.settings import RecognitionSettings

logger = logging.getLogger(__name__)

GATE_CLOSED = Gauge(
    "mailroom_recognition_gate_closed",
    "1 while the recognition health gate of a pipeline holds its jobs, else 0.",
    ["pipeline"],
    # NOTE: in a worker's multiprocess exporter, the value its latest check set in any process.
    multiprocess_mode="livemostrecent",
)

ANSWERS_UNREAD = Gauge(
    "mailroom_recognition_answers_unread",
    "Answers waiting in the inbox's JetStream consumer while no NATS bridge consumes it, else 0.",
    # NOTE: in a worker's multiprocess exporter, the value its latest check set in any process.
    multiprocess_mode="livemostrecent",
)

#: How the reason of a gate held for unread answers begins (status, Sentry, tests).
UNREAD_REASON = "answers unread: the NATS bridge is not consuming"

# Per pipeline: its unacked requests and the last ack and result of any service (indexes
# ix_recognition_job_outbox, _acked and _answered keep each a short index scan).
_CLOCK = text(
    """
    SELECT p.pipeline,
           (SELECT min(published_at) FROM recognition_job
             WHERE status = 'published' AND pipeline = p.pipeline) AS oldest_unacked,
           (SELECT max(started_at) FROM recognition_job
             WHERE kind = 'automatic' AND started_at IS NOT NULL
               AND pipeline = p.pipeline) AS last_ack,
           (SELECT max(finished_at) FROM recognition_job
             WHERE result_msg_id IS NOT NULL AND pipeline = p.pipeline) AS last_result,
           g.closed_at, g.reason
      FROM unnest(CAST(:pipelines AS text[])) AS p(pipeline)
      LEFT JOIN recognition_gate AS g ON g.pipeline = p.pipeline
     ORDER BY p.pipeline
    """
)

_ENSURE_ROW = text(
    "INSERT INTO recognition_gate (pipeline) VALUES (:pipeline) ON CONFLICT DO NOTHING"
)

# Conditional updates: of processes checking at once, exactly one makes each transition.
_CLOSE = text(
    """
    UPDATE recognition_gate SET closed_at = :now, reason = :reason, changed_at = :now
     WHERE pipeline = :pipeline AND closed_at IS NULL
    RETURNING pipeline
    """
)
_REASON = text(
    """
    UPDATE recognition_gate SET reason = :reason, changed_at = :now
     WHERE pipeline = :pipeline AND closed_at IS NOT NULL AND reason IS DISTINCT FROM :reason
    """
)
_OPEN = text(
    """
    WITH was AS (
        SELECT pipeline, closed_at FROM recognition_gate
         WHERE pipeline = :pipeline AND closed_at IS NOT NULL
           FOR UPDATE
    )
    UPDATE recognition_gate AS g SET closed_at = NULL, reason = NULL, changed_at = :now
      FROM was
     WHERE g.pipeline = was.pipeline
    RETURNING was.closed_at
    """
)

# The held jobs start afresh: a new reply deadline and a new no-ack window (the outbox counts
# republishes from ``republish_from``); ``gate_reopened`` keeps the trace.
_REFRESH = text(
    f"""
    UPDATE recognition_job AS j
       SET reply_deadline = GREATEST(j.reply_deadline, :deadline),
           metrics = {object_metrics_sql("j.metrics")} || jsonb_build_object(
               'republish_count', 0,
               'republish_from', CAST(:now AS timestamptz),
               'gate_reopened', jsonb_build_object(
                   'closed_at', CAST(:closed_at AS timestamptz),
                   'at', CAST(:now AS timestamptz),
                   'republishes_before', {republish_count_sql("j.metrics")}))
     WHERE j.pipeline = :pipeline AND j.status IN ('published', 'processing')
    RETURNING j.id
    """
)


@dataclass
class GateState:
    """One check of the gate: which pipelines are held and why, and what changed."""

    #: Pipelines whose jobs the outbox and the watchdog leave alone now.
    held: frozenset[str] = frozenset()
    reasons: dict[str, str] = field(default_factory=dict)
    closed_now: list[str] = field(default_factory=list)
    opened_now: list[str] = field(default_factory=list)
    #: Held jobs given a fresh deadline by this check's reopenings.
    refreshed: int = 0


def silence_reason(
    pipeline: str,
    *,
    oldest_unacked: datetime | None,
    last_ack: datetime | None,
    last_result: datetime | None,
    now: datetime,
    silence_after_s: float,
) -> str | None:
    """Why the gate of ``pipeline`` closes for silence, or None while it need not."""
    since = now - timedelta(seconds=silence_after_s)
    if oldest_unacked is None or oldest_unacked > since:
        return None
    answers = [t for t in (last_ack, last_result) if t is not None]
    last = max(answers, default=None)
    if last is not None and last > since:
        return None
    heard = f"last answer {last:%Y-%m-%d %H:%M:%S %Z}" if last else "none ever"
    return (
        f"no {pipeline} recognition service answered for {silence_after_s:g} s"
        f" while requests wait ({heard})"
    )


def unread_reason(backlog: InboxBacklog | None, *, idle_after_s: float) -> str | None:
    """Why every gate closes for answers nobody reads, or None while a bridge reads them.

    Nobody reads them when answers wait, no bridge asks for more (a pull request would
    be answered at once) and nothing was delivered for ``idle_after_s`` (the bridge's ack
    wait: a bridge that died holding messages gives them back only after it).
    """
    if backlog is None or backlog.waiting == 0 or backlog.pulls > 0:
        return None
    if backlog.idle_s < idle_after_s:
        return None
    return f"{UNREAD_REASON} ({backlog.waiting} answers wait in JetStream)"


async def check_gate(
    sessions: async_sessionmaker[AsyncSession],
    *,
    recognition: RecognitionSettings,
    nats_error: str | None = None,
    inbox: InboxBacklog | None = None,
    idle_after_s: float = 30.0,
    now: datetime | None = None,
    pipelines: Iterable[str] = PIPELINES,
) -> GateState:
    """Decide the gate of each pipeline now, make any transition once, report it once.

    ``nats_error`` is why this process cannot reach NATS (None when it can): every
    pipeline is held then, whatever the jobs say. ``inbox`` is the inbox consumer's
    backlog (None when unknown): answers unread for ``idle_after_s`` hold every pipeline.
    """
    names = list(pipelines)
    state = GateState()
    unread = unread_reason(inbox, idle_after_s=idle_after_s)
    async with sessions() as session, session.begin():
        now = now or await db_now(session)
        rows = (await session.execute(_CLOCK, {"pipelines": names})).all()
        for row in rows:
            reason = (
                f"NATS unreachable: {nats_error}"[:300]
                if nats_error is not None
                else unread
                or silence_reason(
                    row.pipeline,
                    oldest_unacked=row.oldest_unacked,
                    last_ack=row.last_ack,
                    last_result=row.last_result,
                    now=now,
                    silence_after_s=recognition.silence_after_s,
                )
            )
            await _transition(session, state, row, reason, now, recognition)
    for pipeline in names:
        GATE_CLOSED.labels(pipeline).set(1 if pipeline in state.held else 0)
    ANSWERS_UNREAD.set(inbox.waiting if unread is not None and inbox is not None else 0)
    _report(state)
    return state


async def _transition(
    session: AsyncSession,
    state: GateState,
    row: Any,
    reason: str | None,
    now: datetime,
    recognition: RecognitionSettings,
) -> None:
    params = {"pipeline": row.pipeline, "now": now, "reason": reason}
    if reason is not None:
        state.held |= {row.pipeline}
        state.reasons[row.pipeline] = reason
        if row.closed_at is None:
            await session.execute(_ENSURE_ROW, params)
            if (await session.execute(_CLOSE, params)).first() is not None:
                state.closed_now.append(row.pipeline)
        elif row.reason != reason:
            await session.execute(_REASON, params)
        return
    if row.closed_at is None:
        return
    opened = (await session.execute(_OPEN, params)).first()
    if opened is None:
        return  # another process reopened it (and refreshed the jobs) first
    state.opened_now.append(row.pipeline)
    deadline = now + timedelta(seconds=recognition.reply_deadline_s)
    refreshed = await session.execute(
        _REFRESH, {**params, "deadline": deadline, "closed_at": opened.closed_at}
    )
    state.refreshed += len(refreshed.all())


def _report(state: GateState) -> None:
    for pipeline in state.closed_now:
        reason = state.reasons[pipeline]
        logger.warning("Recognition gate of %s closed: %s", pipeline, reason)
        sentry_sdk = active_sentry()
        if sentry_sdk is None:
            continue
        with sentry_sdk.new_scope() as scope:
            scope.set_tag("recognition.pipeline", pipeline)
            scope.set_extra("reason", reason)
            # NOTE: a stable message per cause groups every closing into one Sentry issue.
            message = (
                f"Recognition {UNREAD_REASON}: jobs of {pipeline} held"
                if reason.startswith(UNREAD_REASON)
                else f"Recognition gate closed for {pipeline}: jobs held"
            )
            sentry_sdk.capture_message(message, level="warning")
    for pipeline in state.opened_now:
        logger.info(
            "Recognition gate of %s open again: answers arrive; %d held jobs refreshed",
            pipeline,
            state.refreshed,
        )


_STATUS = text(
    """
    SELECT pipeline, closed_at, reason FROM recognition_gate
     WHERE closed_at IS NOT NULL
     ORDER BY pipeline
    """
)


async def closed_gates(session: AsyncSession) -> list[dict[str, Any]]:
    """The closed gates as the last check recorded them (``mailroom status``)."""
    rows = (await session.execute(_STATUS)).all()
    return [
        {"pipeline": r.pipeline, "closed_at": r.closed_at.isoformat(), "reason": r.reason or ""}
        for r in rows
    ]


def gate_lines(gates: list[dict[str, Any]]) -> list[str]:
    """One line per closed gate for ``mailroom status``: since when, why, what it means."""
    return [
        f"Recognition of {g['pipeline']} held since {g['closed_at'][:19]}: {g['reason']}."
        " Its jobs wait (no republish counted, no dlq, no timeout) and go on by themselves"
        + (
            " when a NATS bridge reads the answers (is `mailroom bridge nats` running?)."
            if g["reason"].startswith(UNREAD_REASON)
            else " when a service answers."
        )
        for g in gates
    ]
