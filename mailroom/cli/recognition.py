"""`mailroom recognition …`: operator commands for the recognition pipeline.

``status`` shows where jobs and files stand; ``replay`` gives failed attempts
(dlq / timeout / error) a new attempt, audit-logged with the operator's OS user,
and nudges the outbox publisher so the new requests go out at once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TypeVar

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy import Interval, func, select, text, type_coerce
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.db.audit import OPERATOR, operator_id
from mailroom.db.engine import create_engine, create_sessionmaker, transaction
from mailroom.db.models import FILE_STATUSES, JOB_STATUSES, PIPELINES, RecognitionJob, StoredFile
from mailroom.errors import ReplayRefused
from mailroom.recognition.replay import ReplayedJob, replay_job, replay_jobs_by_status
from mailroom.settings import Settings

logger = logging.getLogger(__name__)

app = typer.Typer(no_args_is_help=True, help="Operate the recognition pipeline.")

#: Longest reason shown for a stuck file, in characters.
REASON_CHARS = 160

T = TypeVar("T")


class ReplayStatus(StrEnum):
    dlq = "dlq"
    timeout = "timeout"
    error = "error"


@dataclass(frozen=True)
class RecognitionStatus:
    """Counts for ``status``: jobs per (pipeline, status), files per status."""

    jobs: dict[tuple[str, str], int]
    files: dict[str, int]
    #: Jobs published and still waiting for their ack, and how long the oldest has waited.
    unacked: int
    oldest_unacked: timedelta | None


async def read_status(session: AsyncSession) -> RecognitionStatus:
    job_rows = await session.execute(
        select(RecognitionJob.pipeline, RecognitionJob.status, func.count()).group_by(
            RecognitionJob.pipeline, RecognitionJob.status
        )
    )
    file_rows = await session.execute(
        select(StoredFile.status, func.count()).group_by(StoredFile.status)
    )
    unacked = (
        await session.execute(
            select(
                func.count(),
                type_coerce(func.now() - func.min(RecognitionJob.published_at), Interval),
            ).where(RecognitionJob.status == "published")
        )
    ).one()
    return RecognitionStatus(
        jobs={(pipeline, status): count for pipeline, status, count in job_rows},
        files={status: count for status, count in file_rows},
        unacked=unacked[0],
        oldest_unacked=unacked[1],
    )


def render_status(status: RecognitionStatus, console: Console) -> None:
    pipelines = _ordered(PIPELINES, {p for p, _ in status.jobs})
    jobs = Table(title="Recognition jobs (every attempt)")
    jobs.add_column("status")
    for pipeline in pipelines:
        jobs.add_column(pipeline, justify="right")
    jobs.add_column("total", justify="right")
    for job_status in _ordered(JOB_STATUSES, {s for _, s in status.jobs}):
        counts = [status.jobs.get((p, job_status), 0) for p in pipelines]
        jobs.add_row(job_status, *map(str, counts), str(sum(counts)))
    console.print(jobs)

    files = Table(title="Files")
    files.add_column("status")
    files.add_column("files", justify="right")
    for file_status in _ordered(FILE_STATUSES, set(status.files)):
        files.add_row(file_status, str(status.files.get(file_status, 0)))
    console.print(files)

    if status.oldest_unacked is None:
        console.print("Published without ack: none")
    else:
        console.print(
            f"Published without ack: {status.unacked}, oldest waiting {_age(status.oldest_unacked)}"
        )


@dataclass(frozen=True)
class StuckFile:
    file_id: int
    job_id: uuid.UUID
    file_status: str
    job_status: str
    reason: str
    since: datetime


@dataclass(frozen=True)
class StuckFiles:
    items: list[StuckFile]
    #: Every stuck or failed file, listed or not.
    total: int


# A file's current job only: superseded attempts need nobody. A job past its reply
# deadline is stuck until the watchdog ends it.
_STUCK_WHERE = """
FROM stored_file f JOIN recognition_job j ON j.id = f.current_recognition_job_id
WHERE f.status IN ('NEEDS_CHECK', 'ERROR') OR j.status IN ('dlq', 'timeout', 'error')
   OR (j.status IN ('published', 'processing') AND j.reply_deadline < now())
"""


async def read_stuck(session: AsyncSession, limit: int) -> StuckFiles:
    """Files that need an operator (or are overdue), oldest first, with their reasons."""
    total = int(await session.scalar(text("SELECT count(*) " + _STUCK_WHERE)) or 0)
    rows = await session.execute(
        text(
            "SELECT f.id, j.id, f.status, j.status, j.error_code, j.error_message, "
            "f.status_reason, COALESCE(j.finished_at, j.requested_at) AS since "
            + _STUCK_WHERE
            + " ORDER BY since, f.id LIMIT :limit"
        ),
        {"limit": limit},
    )
    items = [
        StuckFile(
            file_id=file_id,
            job_id=job_id,
            file_status=file_status,
            job_status=job_status,
            reason=_reason(job_status, code, message, status_reason),
            since=since,
        )
        for file_id, job_id, file_status, job_status, code, message, status_reason, since in rows
    ]
    return StuckFiles(items, total)


def _reason(job_status: str, code: str | None, message: str | None, file_reason: str | None) -> str:
    if job_status in ("published", "processing"):
        return "no answer by the reply deadline (the watchdog will end it)"
    text_ = ": ".join(part for part in (code, message) if part) or file_reason or job_status
    return text_.replace("\n", " ")[:REASON_CHARS]


def render_stuck(stuck: StuckFiles, console: Console) -> None:
    if not stuck.total:
        console.print("Files waiting for an operator: none")
        return
    table = Table(
        title=f"Files waiting for an operator ({len(stuck.items)} of {stuck.total}, oldest first)",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("file", justify="right")
    table.add_column("current job (replay --job)", no_wrap=True)
    table.add_column("status")
    table.add_column("reason")
    for item in stuck.items:
        table.add_row(
            str(item.file_id),
            str(item.job_id),
            f"{item.file_status}\njob {item.job_status}",
            escape(item.reason),
        )
    console.print(table)
    console.print(
        "Review one: mailroom review show FILE; replay: mailroom recognition replay --job"
    )


def _ordered(known: tuple[str, ...], seen: set[str]) -> list[str]:
    return [*known, *sorted(seen - set(known))]


def _age(age: timedelta) -> str:
    seconds = max(0, int(age.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {seconds:02d}s" if hours else f"{minutes}m {seconds:02d}s"


@app.command()
def status(
    limit: int = typer.Option(20, "--limit", min=0, help="Most stuck or failed files listed."),
) -> None:
    """Job and file counts, then the files that wait for an operator and why.

    Each listed file shows its current job id, which replay --job takes.
    """
    settings = Settings()

    async def read(session: AsyncSession) -> tuple[RecognitionStatus, StuckFiles]:
        return await read_status(session), await read_stuck(session, limit)

    result, stuck = asyncio.run(_with_session(settings, read))
    console = Console()
    render_status(result, console)
    render_stuck(stuck, console)


@app.command()
def replay(
    job: str | None = typer.Option(None, "--job", help="Replay this job id."),
    job_status: ReplayStatus | None = typer.Option(
        None, "--status", help="Replay current jobs in this status."
    ),
    limit: int = typer.Option(100, "--limit", min=1, help="Most jobs replayed by --status."),
    reason: str = typer.Option("", "--reason", help="Recorded in the audit event."),
) -> None:
    """Give a dlq / timeout / error job a new attempt (audit-logged), then nudge the publisher."""
    if (job is None) == (job_status is None):
        raise typer.BadParameter("give exactly one of --job or --status")
    job_id: uuid.UUID | None = None
    if job is not None:
        try:
            job_id = uuid.UUID(job)
        except ValueError as exc:
            raise typer.BadParameter(f"{job[:60]!r} is not a job id", param_hint="--job") from exc
    settings = Settings()
    actor_id = operator_id()

    async def run_replay(session: AsyncSession) -> list[ReplayedJob]:
        if job_id is not None:
            return [
                await replay_job(
                    session, job_id, actor_type=OPERATOR, actor_id=actor_id, reason=reason
                )
            ]
        return await replay_jobs_by_status(
            session,
            str(job_status),
            limit=limit,
            actor_type=OPERATOR,
            actor_id=actor_id,
            reason=reason,
        )

    try:
        replayed = asyncio.run(_with_session(settings, run_replay))
    except ReplayRefused as exc:
        typer.echo(f"not replayed: {exc}", err=True)
        raise typer.Exit(1) from exc
    if not replayed:
        typer.echo(f"no current {job_status} jobs to replay")
        return
    for item in replayed:
        typer.echo(
            f"replayed job {item.old_job_id} ({item.previous_status}) as {item.new_job_id}, "
            f"attempt {item.attempt}, file {item.file_id}"
        )
    typer.echo(f"{len(replayed)} job(s) queued by {actor_id}")
    _nudge_publisher()


async def _with_session(settings: Settings, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    engine = create_engine(settings.database)
    try:
        async with transaction(create_sessionmaker(engine)) as session:
            return await work(session)
    finally:
        await engine.dispose()


def _nudge_publisher() -> None:
    """Send the outbox pass now; the scheduler's sweep catches up if the broker is down."""
    import dramatiq.errors
    import redis.exceptions

    from actors.recognition import publish_recognition_requests

    try:
        publish_recognition_requests.send()
    except (dramatiq.errors.DramatiqError, redis.exceptions.RedisError, OSError) as exc:
        typer.echo(
            f"warning: the outbox publisher was not nudged ({type(exc).__name__}); "
            "the scheduler's outbox sweep will publish the new jobs",
            err=True,
        )
        return
    typer.echo("outbox publisher nudged")
