"""Recognition actors: outbox relay, inbox, watchdog, mapping and its sweep."""

from __future__ import annotations

from typing import Any

import dramatiq

from actors import queues
from actors.retry_policy import RetryPolicy


@dramatiq.actor(queue_name=queues.OUTBOX, retry_policy=RetryPolicy(max_attempts=3))
async def publish_recognition_requests() -> None:
    """One outbox pass: publish queued jobs, republish unacked ones (DESIGN.md §5)."""
    raise NotImplementedError("owned by the recognition engineer")


@dramatiq.actor(queue_name=queues.INBOX, retry_policy=RetryPolicy(max_attempts=20))
async def apply_recognition_message(subject: str, data: str, headers: dict[str, Any]) -> None:
    """Apply one ack or result from a recognition service (DESIGN.md §5)."""
    raise NotImplementedError("owned by the recognition engineer")


@dramatiq.actor(queue_name=queues.MAPPING, retry_policy=RetryPolicy(max_attempts=10))
async def map_recognition_result(job_id: str) -> None:
    """Turn one result file into a document (DESIGN.md §5)."""
    raise NotImplementedError("owned by the recognition engineer")


@dramatiq.actor(queue_name=queues.MAINTENANCE, retry_policy=RetryPolicy(max_attempts=1))
async def expire_recognition_deadlines() -> None:
    """Time out jobs past their reply deadline."""
    raise NotImplementedError("owned by the recognition engineer")


@dramatiq.actor(queue_name=queues.MAINTENANCE, retry_policy=RetryPolicy(max_attempts=1))
async def sweep_unmapped_results() -> None:
    """Re-send mapping for results left unmapped."""
    raise NotImplementedError("owned by the recognition engineer")
