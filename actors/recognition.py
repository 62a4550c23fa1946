"""Recognition actors: outbox relay, inbox, watchdog, mapping and its sweep."""

from __future__ import annotations

import base64
import binascii
import logging
import uuid
from collections.abc import Iterable
from typing import Any

import dramatiq
from dramatiq.asyncio import async_to_sync

from actors import queues
from actors.broker.sending import send_each_off_loop, send_off_loop
from actors.middleware.resources import current
from actors.middleware.retry_policy import RetryPolicy
from actors.notifications import request_notification_pass
from mailroom import queues as actor_names
from mailroom.errors import NatsPublishFailed, NatsUnavailable
from mailroom.recognition import gate, watchdog
from mailroom.recognition.finality import short_repr
from mailroom.recognition.inbox import apply as inbox
from mailroom.recognition.inbox.messages import InboxMessage
from mailroom.recognition.mapping import run as mapping
from mailroom.recognition.outbox import relay as outbox
from mailroom.recognition.outbox import window

logger = logging.getLogger(__name__)


async def on_mails_final(mail_ids: Iterable[int]) -> None:
    """These mails just became final (every file settled): create their notifications.

    One pass request for all of them, coalesced with a pass already queued. The
    scheduler's notification sweep sends the same actor, so a crash right here
    only delays them.
    """
    finals = list(mail_ids)
    for mail_id in finals:  # DEBUG: mapping's batch line counts them, the pass logs its own
        logger.debug("Mail %d is final", mail_id)
    if finals:
        await request_notification_pass(settle=False)


@dramatiq.actor(
    **actor_names.PUBLISH_RECOGNITION_REQUESTS.declared, retry_policy=RetryPolicy(max_attempts=3)
)
async def publish_recognition_requests() -> None:
    """One outbox pass: publish queued jobs, republish unacked ones (ARCHITECTURE.md, Recognition)."""
    resources = current()
    settings = resources.settings
    sessions = await resources.sessions()
    await window.pass_started(await resources.redis(), settings.nats)
    try:
        publisher = await resources.nats()
    except NatsUnavailable as exc:
        # NOTE: the gate records the outage, so the watchdog holds these jobs too.
        await gate.check_gate(sessions, recognition=settings.recognition, nats_error=str(exc))
        logger.warning("Outbox pass skipped: %s", exc)
        return
    nats_error = None if publisher.is_connected else "no NATS connection"
    state = await gate.check_gate(
        sessions,
        recognition=settings.recognition,
        nats_error=nats_error,
        inbox=await publisher.inbox_backlog(),
        idle_after_s=settings.nats.bridge_ack_wait_s,
    )
    result = await outbox.publish_recognition_requests(
        sessions,
        publisher,
        nats=settings.nats,
        recognition=settings.recognition,
        held=state.held,
    )
    await on_mails_final(result.finalized_mail_ids)
    if result.window_full:
        await window.mark_waiting(await resources.redis(), settings.nats)
    if result.error is not None:
        raise NatsPublishFailed(result.error)
    if result.more:
        await send_off_loop(publish_recognition_requests)


async def _publishes_more(applied: Iterable[str]) -> bool:
    """Acks or answers freed places in a window that may hold queued jobs back, and no pass
    is queued yet: send one (window.py)."""
    if not window.frees_places(applied):
        return False
    resources = current()
    return await window.request_pass(await resources.redis(), resources.settings.nats)


def _inbox_message(subject: Any, data: Any, headers: Any) -> InboxMessage | None:
    """The bridge's (subject, base64 body, headers) decoded; ``None`` (warned) when malformed."""
    try:
        body = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError, TypeError):
        logger.warning(
            "Rejected recognition message on %s: body is not base64", short_repr(subject)
        )
        return None
    if not isinstance(headers, dict):
        headers = {}
    return InboxMessage(str(subject), body, {str(k): str(v) for k, v in headers.items()})


@dramatiq.actor(queue_name=queues.INBOX, retry_policy=RetryPolicy(max_attempts=20))
async def apply_recognition_message(subject: str, data: str, headers: dict[str, Any]) -> None:
    """Apply one ack or result from a recognition service (ARCHITECTURE.md, Recognition).

    ``data`` is the NATS body, base64-encoded (actor arguments are JSON).
    """
    message = _inbox_message(subject, data, headers)
    if message is None:
        return
    resources = current()
    result = await inbox.apply_recognition_message(
        await resources.sessions(),
        subject=message.subject,
        data=message.data,
        headers=message.headers,
        max_bytes=resources.settings.recognition.max_message_bytes,
        max_attempts=resources.settings.recognition.max_processing_attempts,
        results_bucket=resources.settings.storage.results_bucket,
    )
    await on_mails_final(result.finalized_mail_ids)
    if result.map_job_id is not None:
        await send_off_loop(map_recognition_results, [str(result.map_job_id)])
    if await _publishes_more([result.applied]):
        await send_off_loop(publish_recognition_requests)


@dramatiq.actor(
    **actor_names.APPLY_RECOGNITION_MESSAGES.declared, retry_policy=RetryPolicy(max_attempts=20)
)
def apply_recognition_messages(messages: list[dict[str, Any]]) -> None:
    """Apply a batch of acks and results in one transaction (ARCHITECTURE.md, Recognition).

    Each item is ``{"subject", "data" (base64 body), "headers"}``, as the NATS
    bridge forwards them. A message the inbox could not apply even on its own is
    sent on as its own ``apply_recognition_message``, so it retries alone.

    The batch is applied on the worker's event loop; its follow-up messages are sent from
    this worker thread once it is back (broker calls block: here they hold up no other
    batch, and no executor thread is woken for them, a hop per batch).
    """
    followups = _apply_batch_on_loop(messages)
    if followups is not None:
        _send_inbox_followups(*followups)


async def _apply_batch(
    messages: list[dict[str, Any]],
) -> tuple[list[str], list[tuple[InboxMessage, str]], bool] | None:
    """The batch applied; its follow-ups: jobs to map, messages to retry alone, a publish
    pass. ``None`` when no item was a message."""
    encoded: list[str] = []
    decoded: list[InboxMessage] = []
    for item in messages if isinstance(messages, list) else [messages]:
        if not isinstance(item, dict):
            logger.warning("Rejected recognition batch item: not an object")
            continue
        message = _inbox_message(item.get("subject"), item.get("data"), item.get("headers"))
        if message is not None:
            encoded.append(item["data"])
            decoded.append(message)
    if not decoded:
        return None
    resources = current()
    outcomes = await inbox.apply_recognition_messages(
        await resources.sessions(),
        decoded,
        max_bytes=resources.settings.recognition.max_message_bytes,
        max_attempts=resources.settings.recognition.max_processing_attempts,
        results_bucket=resources.settings.storage.results_bucket,
    )
    await on_mails_final(mail_id for o in outcomes for mail_id in o.finalized_mail_ids)
    map_job_ids = [str(o.map_job_id) for o in outcomes if o.map_job_id is not None]
    failed = [
        (message, data)
        for message, data, outcome in zip(decoded, encoded, outcomes, strict=True)
        if outcome.applied == "failed"
    ]
    return map_job_ids, failed, await _publishes_more(o.applied for o in outcomes)


_apply_batch_on_loop = async_to_sync(_apply_batch)


def _send_inbox_followups(
    map_job_ids: list[str], failed: list[tuple[InboxMessage, str]], publish: bool = False
) -> None:
    if map_job_ids:
        map_recognition_results.send(map_job_ids)
    if publish:  # one pass for the whole batch
        publish_recognition_requests.send()
    for message, data in failed:
        apply_recognition_message.send(message.subject, data, dict(message.headers))
    if failed:
        logger.warning("Recognition batch: %d messages sent on to retry alone", len(failed))


@dramatiq.actor(queue_name=queues.MAPPING, retry_policy=RetryPolicy(max_attempts=10))
async def map_recognition_results(job_ids: list[str]) -> None:
    """Turn the result files of one inbox batch into documents (ARCHITECTURE.md, Recognition).

    A job that fails in the batch is sent on as its own ``map_recognition_result``, so it
    retries alone; when all fail the batch raises and is retried (idempotent by job).
    """
    parsed = _job_ids(job_ids if isinstance(job_ids, list) else [job_ids])
    if not parsed:
        return
    resources = current()
    outcomes = await mapping.map_recognition_results(
        await resources.sessions(),
        await resources.store(),
        parsed,
        settings=resources.settings.recognition,
    )
    await on_mails_final(mail_id for o in outcomes for mail_id in o.finalized_mail_ids)
    if any(o.replayed is not None for o in outcomes):
        await send_off_loop(publish_recognition_requests)
    failed = [(str(o.job_id),) for o in outcomes if o.applied == "failed"]
    if await send_each_off_loop(map_recognition_result, failed):
        logger.warning("Mapping batch: %d jobs sent on to retry alone", len(failed))


@dramatiq.actor(queue_name=queues.MAPPING, retry_policy=RetryPolicy(max_attempts=10))
async def map_recognition_result(job_id: str) -> None:
    """Turn one result file into a document: a job retried alone, the sweep's, or one queued earlier."""
    parsed = _job_ids([job_id])
    if not parsed:
        return
    resources = current()
    result = await mapping.map_recognition_result(
        await resources.sessions(),
        await resources.store(),
        parsed[0],
        settings=resources.settings.recognition,
    )
    await on_mails_final(result.finalized_mail_ids)
    if result.replayed is not None:
        await send_off_loop(publish_recognition_requests)


def _job_ids(values: list[Any]) -> list[uuid.UUID]:
    """The values that are uuids; each other one is warned about and dropped."""
    parsed = []
    for value in values:
        try:
            parsed.append(uuid.UUID(value))
        except (ValueError, TypeError, AttributeError):
            logger.warning("Mapping skipped: job id %s is not a uuid", short_repr(value))
    return parsed


@dramatiq.actor(
    **actor_names.EXPIRE_RECOGNITION_DEADLINES.declared, retry_policy=RetryPolicy(max_attempts=1)
)
async def expire_recognition_deadlines() -> None:
    """Time out jobs past their reply deadline, but none while its health gate is closed."""
    resources = current()
    sessions = await resources.sessions()
    inbox = None
    try:
        nats = await resources.nats()
        nats_error = None if nats.is_connected else "no NATS connection"
        inbox = await nats.inbox_backlog()
    except NatsUnavailable as exc:
        nats_error = str(exc)
    state = await gate.check_gate(
        sessions,
        recognition=resources.settings.recognition,
        nats_error=nats_error,
        inbox=inbox,
        idle_after_s=resources.settings.nats.bridge_ack_wait_s,
    )
    result = await watchdog.expire_recognition_deadlines(
        sessions,
        batch_size=resources.settings.recognition.watchdog_batch_size,
        held=state.held,
        automatic_attempts=resources.settings.recognition.automatic_attempts,
    )
    await on_mails_final(result.finalized_mail_ids)
    if result.replayed:
        await send_off_loop(publish_recognition_requests)


@dramatiq.actor(
    **actor_names.SWEEP_UNMAPPED_RESULTS.declared, retry_policy=RetryPolicy(max_attempts=1)
)
async def sweep_unmapped_results() -> None:
    """Re-send mapping for results left unmapped."""
    resources = current()
    job_ids = await mapping.find_unmapped_results(
        await resources.sessions(), settings=resources.settings.recognition
    )
    await send_each_off_loop(map_recognition_result, ((str(job_id),) for job_id in job_ids))
    if job_ids:
        logger.info("Unmapped-result sweep re-sent %d jobs to mapping", len(job_ids))
