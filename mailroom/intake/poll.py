"""``poll_mailbox``: claim the cursor, run one batch under the lease, record how it ended.

Collaborators come in as arguments (sessions, object store, mailbox factory,
clock, the publisher nudge); the actor wires them. The outcome says whether
more mail is waiting, so the caller can poll again at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

import psycopg
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.imap import MailboxFactory
from mailroom.adapters.storage import ObjectStore
from mailroom.db.clock import DbClock, db_now
from mailroom.errors import (
    AppError,
    LeaseLost,
    MailFailed,
    UnknownMailbox,
    describe_error,
)
from mailroom.intake import cursor as cursors
from mailroom.intake import cursor_failures as failures
from mailroom.intake.batch import BatchContext, BatchResult, Nudge, run_batch
from mailroom.intake.cursor import Claim
from mailroom.intake.lease import run_under_lease
from mailroom.intake.refusals import blocked_message, refusal_reason
from mailroom.settings import IntakeSettings, MailboxSettings

logger = logging.getLogger(__name__)

Status = Literal[
    "done", "skipped", "disabled", "lease_lost", "mail_failed", "blocked", "batch_failed"
]


@dataclass(frozen=True)
class IntakeDeps:
    """What the pipeline needs from the outside world."""

    sessions: async_sessionmaker[AsyncSession]
    store: ObjectStore
    connect: MailboxFactory
    nudge: Nudge
    #: The database's clock; tests move it forward (ARCHITECTURE.md, One clock).
    clock: DbClock = db_now


@dataclass(frozen=True)
class PollOutcome:
    mailbox: str
    status: Status
    #: Why: the skip reason, or the error that ended the batch.
    reason: str = ""
    result: BatchResult | None = None

    @property
    def more_waiting(self) -> bool:
        return self.status == "done" and self.result is not None and self.result.more_waiting


def find_mailbox(settings: IntakeSettings, name: str) -> MailboxSettings:
    for mailbox in settings.mailboxes:
        if mailbox.name == name:
            return mailbox
    raise UnknownMailbox(f"mailbox {name[:100]!r} is not configured")


async def poll_mailbox(name: str, *, settings: IntakeSettings, deps: IntakeDeps) -> PollOutcome:
    """One poll of mailbox ``name`` (ARCHITECTURE.md, Intake)."""
    mailbox = find_mailbox(settings, name)
    if not mailbox.enabled:
        return PollOutcome(name, "disabled")
    started = time.monotonic()
    claimed = await cursors.claim_cursor(
        deps.sessions,
        mailbox=mailbox.name,
        folder=mailbox.folder,
        lease_s=settings.lease_s,
        clock=deps.clock,
    )
    if isinstance(claimed, cursors.Skipped):
        logger.debug("Mailbox %s: skipped (%s)", name, claimed.reason)
        return PollOutcome(name, "skipped", claimed.reason)
    claim = claimed
    claimed_at = time.monotonic()
    ctx = BatchContext(claim, mailbox, settings, deps.sessions, deps.store, deps.nudge)

    async def renew() -> bool:
        return await cursors.renew_lease(
            deps.sessions, claim, lease_s=settings.lease_s, clock=deps.clock
        )

    try:
        result = await run_under_lease(
            run_batch(ctx, deps.connect(mailbox)),
            renew=renew,
            interval_s=settings.lease_s / 3,
            name=f"mailbox {name}",
        )
    except LeaseLost as exc:
        await _give_back(ctx, deps)
        return _lease_lost(name, exc)
    except MailFailed as exc:
        return await _mail_failed(ctx, settings, deps, exc)
    except Exception as exc:  # the batch could not run: IMAP down, login refused, fetch error
        return await _batch_failed(ctx, settings, deps, exc)
    except BaseException:  # cancelled (the worker stops): not an attempt that killed a worker
        await _give_back(ctx, deps)
        raise
    batch_done_at = time.monotonic()
    try:
        if await cursors.finish_batch(deps.sessions, claim, highest_uid=result.highest_uid):
            result.more_waiting = True  # a poll sent meanwhile (new mail) found us running
    except LeaseLost as exc:
        await _give_back(ctx, deps)
        return _lease_lost(name, exc)
    # Where a poll's time went, on its log line: it tells a slow server from a slow database.
    phases = (
        f"claim {claimed_at - started:.3f} s, IMAP setup {result.setup_s:.3f} s, "
        f"mails {batch_done_at - claimed_at - result.setup_s:.3f} s, "
        f"finish {time.monotonic() - batch_done_at:.3f} s"
    )
    if result.ingested or result.duplicates or result.erased:
        logger.info(
            "Mailbox %s: %d mail(s) stored, %d duplicate(s), %d erased before, %d job(s); "
            "last UID %d%s (%s)",
            name,
            result.ingested,
            result.duplicates,
            result.erased,
            result.jobs,
            result.highest_uid,
            ", more waiting" if result.more_waiting else "",
            phases,
        )
    else:
        logger.debug("Mailbox %s: no new mail (%s)", name, phases)
    return PollOutcome(name, "done", result=result)


async def _give_back(ctx: BatchContext, deps: IntakeDeps) -> None:
    """The batch came back without recording its end: uncount its attempt, if it counted one."""
    if ctx.attempt.uid is not None:
        await cursors.give_back_attempt(deps.sessions, ctx.claim, ctx.attempt.uid)


def _lease_lost(name: str, exc: LeaseLost) -> PollOutcome:
    logger.warning("Mailbox %s: lease lost, batch abandoned: %s", name, exc)
    return PollOutcome(name, "lease_lost", str(exc))


async def _mail_failed(
    ctx: BatchContext, settings: IntakeSettings, deps: IntakeDeps, exc: MailFailed
) -> PollOutcome:
    claim = ctx.claim
    _log_failure(claim.mailbox, f"UID {exc.uid} failed", exc.cause)
    try:
        failure = await failures.record_mail_failure(
            deps.sessions,
            claim,
            uidvalidity=_uidvalidity(claim, exc),
            uid=exc.uid,
            message_id=exc.message_id,
            error=exc.cause,
            max_retries=settings.max_retries,
            max_backoff_s=settings.max_backoff_s,
            clock=deps.clock,
            exhausted=exc.exhausted,
        )
    except LeaseLost as lost:
        await _give_back(ctx, deps)
        return _lease_lost(claim.mailbox, lost)
    if failure.status == "blocked":
        logger.error(
            "Mailbox %s: blocked at UID %d (%r) after %d attempts; "
            "`mailroom intake unblock %s` after fixing the cause",
            claim.mailbox,
            exc.uid,
            (exc.message_id or "")[:200],
            failure.retry_count,
            claim.mailbox,
        )
        return PollOutcome(claim.mailbox, "blocked", describe_error(exc.cause))
    return PollOutcome(claim.mailbox, "mail_failed", describe_error(exc.cause))


def _uidvalidity(claim: Claim, exc: MailFailed) -> int:
    # Mails only fail after SELECT, so the batch always knows the folder's UIDVALIDITY.
    return exc.uidvalidity if exc.uidvalidity is not None else int(claim.uidvalidity or 0)


async def _batch_failed(
    ctx: BatchContext, settings: IntakeSettings, deps: IntakeDeps, exc: Exception
) -> PollOutcome:
    claim = ctx.claim
    _log_failure(claim.mailbox, "batch failed", exc)
    # A refused login (password or OAuth grant), a folder that is not there or a certificate
    # that does not verify is retried like any batch failure, then blocked for an operator:
    # backing off for ever would hide it. Anything else (server down, timeouts) backs off.
    reason = refusal_reason(exc)
    try:
        failure = await failures.record_batch_failure(
            deps.sessions,
            claim,
            error=exc,
            max_backoff_s=settings.max_backoff_s,
            counted=ctx.attempt.uid,
            clock=deps.clock,
            block_after=settings.block_after_refusals if reason else None,
            reason=reason,
        )
    except LeaseLost as lost:
        await _give_back(ctx, deps)
        return _lease_lost(claim.mailbox, lost)
    if failure.status == "blocked" and reason is not None:
        # One ERROR line: the log's and, through the logging integration, Sentry's one event.
        logger.error(
            "%s (%s)",
            blocked_message(ctx.mailbox, reason, failure.retry_count),
            describe_error(exc)[:300],
        )
        return PollOutcome(claim.mailbox, "blocked", describe_error(exc))
    logger.info(
        "Mailbox %s: retry %d not before %s",
        claim.mailbox,
        failure.retry_count,
        failure.next_retry_at,
    )
    return PollOutcome(claim.mailbox, "batch_failed", describe_error(exc))


def _log_failure(mailbox: str, what: str, exc: BaseException) -> None:
    # Expected kinds of trouble (the cursor records them); database errors are logged
    # without traceback because SQLAlchemy's text echoes parameters, i.e. mail headers
    # (the per-mail statement runs on psycopg directly, so its errors come unwrapped).
    if isinstance(exc, AppError | SQLAlchemyError | psycopg.Error):
        logger.warning("Mailbox %s: %s: %r", mailbox, what, describe_error(exc)[:300])
    else:  # a bug or an unexpected library error: keep the traceback (and reach Sentry)
        logger.error("Mailbox %s: %s", mailbox, what, exc_info=exc)
