"""What delivering a message ended in, a batch's outcomes, and the error text a row keeps."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from mailroom.db.models import FINAL_MESSAGE_STATUSES

logger = logging.getLogger(__name__)

#: Longest error text stored in ``last_error``.
MAX_ERROR_CHARS = 500


class Outcome(StrEnum):
    DELIVERED = "delivered"
    SETTLED = "settled"  # delivered or failed earlier: nothing to do
    HELD = "held"  # another attempt holds the lock
    MISSING = "missing"
    NOT_DUE = "not_due"  # pending with a later next_retry_at: its own retry is on the way
    FAILED = "failed"
    PARTIAL_FAILED = "partial_failed"
    UNCERTAIN = "uncertain"
    LEASE_LOST = "lease_lost"
    DEFERRED = "deferred"  # runs again later: see ``BatchResult.retries``


@dataclass
class BatchResult:
    """What a batch did, by message id."""

    outcomes: dict[int, Outcome] = field(default_factory=dict)
    #: Messages to run again later (outcome ``DEFERRED``): ``DeliveryDeferred`` with its
    #: wait, or the error that stopped the attempt (infrastructure, a bug).
    retries: dict[int, Exception] = field(default_factory=dict)


def unclaimed(message_id: int, status: str | None) -> Outcome:
    """Why a message was not claimed, from its status (None: no such message)."""
    if status is None:
        logger.warning("Channel message %s does not exist; nothing to deliver", message_id)
        return Outcome.MISSING
    if status in FINAL_MESSAGE_STATUSES:
        return Outcome.SETTLED
    logger.debug("Message %s is not due yet; its own retry will deliver it", message_id)
    return Outcome.NOT_DUE


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def truncate_error(value: str, limit: int = MAX_ERROR_CHARS) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


def log_batch(result: BatchResult) -> None:
    """One INFO line per batch with its outcomes counted; each delivery is a DEBUG line.

    An INFO line per delivered message cost the worker more CPU than a quarter of the
    delivery (delivery bench); what did not go as planned keeps a warning of its own, with
    the message's id, and every delivery is on its row (``status``, ``delivered_at``).
    """
    if result.outcomes and logger.isEnabledFor(logging.INFO):
        counts = Counter(result.outcomes.values())
        logger.info(
            "Delivery batch: %s",
            ", ".join(
                f"{counts[outcome]} {outcome.value}" for outcome in Outcome if counts[outcome]
            ),
        )
