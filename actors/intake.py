"""Intake actors: read a mailbox under its lease."""

from __future__ import annotations

import asyncio
import math

import dramatiq
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from actors.middleware.resources import current
from actors.middleware.retry_policy import RetryPolicy
from actors.notifications import request_notification_pass
from actors.recognition import publish_recognition_requests
from mailroom import queues as actor_names
from mailroom.config_store import effective
from mailroom.intake.pending import mark_polls_queued
from mailroom.intake.poll import IntakeDeps
from mailroom.intake.poll import poll_mailbox as poll
from mailroom.recognition.outbox import window
from mailroom.settings import IntakeSettings

#: The mailboxes of the table, read again only when its mailbox rows change.
_MAILBOXES = effective.runtime_mailboxes()


async def _intake_settings() -> IntakeSettings:
    """The intake settings with the mailboxes of the environment and the table, as of now."""
    resources = current()
    return await _MAILBOXES.get(
        await resources.sessions(),
        resources.settings.intake,
        resources.settings.runtime_config.key.get_secret_value(),
    )


async def _nudge_publisher() -> None:
    """Ask for an outbox pass: one queued and not yet started serves every poll's jobs.

    Without the mark each poll queued a pass of its own, and a backlog of many small
    polls cost the downstream worker one pass per poll (``window.publish_pass``).
    """
    resources = current()
    if await window.publish_pass(resources.settings.nats).request(await resources.redis()):
        # Sending talks to the broker synchronously: keep it off the event loop.
        await asyncio.to_thread(publish_recognition_requests.send)


# Failures of a batch are recorded on the cursor with their own backoff, so the actor
# returns normally for them; it raises only when Postgres itself cannot be reached.
@dramatiq.actor(**actor_names.POLL_MAILBOX.declared, retry_policy=RetryPolicy(max_attempts=3))
async def poll_mailbox(mailbox: str) -> None:
    """Read new mail of one configured mailbox (ARCHITECTURE.md, Intake)."""
    resources = current()
    sessions = await resources.sessions()
    intake = await _intake_settings()
    deps = IntakeDeps(
        sessions=sessions,
        store=await resources.store(),
        connect=await resources.imap_connections(),
        nudge=_nudge_publisher,
    )
    outcome = await poll(str(mailbox), settings=intake, deps=deps)
    result = outcome.result
    if result is not None and result.final:
        # A mail with nothing to recognize is final at once: let its notification go out now
        # rather than at the next sweep (one pass for every mailbox's, ``request_notification_pass``).
        # A mail with jobs becomes final when its last job ends, and that finisher asks for
        # the pass: asked here too, every poll cost two Redis round trips and made the passes
        # of a backlog look for settled stored mails over and over.
        await request_notification_pass()
    if outcome.more_waiting:
        # More mail waits: the next batch goes to the back of the queue, after the other
        # mailboxes' turns. New mail is announced to the watcher, which sends the next poll.
        await _send_polls(sessions, intake, [mailbox])


async def _send_polls(
    sessions: async_sessionmaker[AsyncSession],
    intake: IntakeSettings,
    names: list[str],
    *,
    watched_poll_interval_s: float | None = None,
    watched_most: int | None = None,
) -> None:
    """Send a poll to each of ``names`` that has none queued or running (``intake.pending``)."""
    folders = {m.name: m.folder for m in intake.mailboxes if m.enabled and m.name in names}
    marked = await mark_polls_queued(
        sessions,
        list(folders.items()),
        lost_after_s=intake.poll_lost_after_s,
        watched_poll_interval_s=watched_poll_interval_s,
        watched_most=watched_most,
    )
    # In the order given (the configured one), so each pass serves the mailboxes alike.
    due = [name for name in names if name in marked]
    await asyncio.to_thread(lambda: [poll_mailbox.send(name) for name in due])


# One attempt: the scheduler sends the next one within a poll interval.
@dramatiq.actor(**actor_names.POLL_MAILBOXES.declared, retry_policy=RetryPolicy(max_attempts=1))
async def poll_mailboxes() -> None:
    """Send ``poll_mailbox`` for each enabled mailbox (the environment's and the table's)."""
    intake = await _intake_settings()
    names = [mailbox.name for mailbox in intake.mailboxes if mailbox.enabled]
    # A mailbox whose last poll is still queued or running gets none: a backlog on the intake
    # queue then holds one poll per mailbox, not one per pass, and each gets its turn.
    # A folder a watcher watches live is polled only now and then (its news come at once),
    # spread over the passes: a pass takes its share of them, enough that each is polled
    # about every interval.
    passes = intake.watched_poll_interval_s / current().settings.scheduler.poll_interval_s
    await _send_polls(
        await current().sessions(),
        intake,
        names,
        watched_poll_interval_s=intake.watched_poll_interval_s,
        watched_most=math.ceil(len(names) / max(passes, 1)),
    )
