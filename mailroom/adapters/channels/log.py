"""The ``log`` channel (dev): one log line per chunk with ids, never the body."""

from __future__ import annotations

import logging

from mailroom.adapters.channels import register
from mailroom.delivery.ports import Envelope
from mailroom.settings import DeliverySettings

logger = logging.getLogger(__name__)


@register("log")
class LogChannel:
    """Writes who would have received what; every account name is accepted."""

    def __init__(self, account: str, settings: DeliverySettings) -> None:
        self.account = account

    async def send(self, envelope: Envelope) -> str | None:
        logger.info(
            "Notification %s chunk %d/%d to %r via log/%s (%d chars)",
            envelope.message_id,
            envelope.chunk,
            envelope.chunks,
            envelope.recipient[:100],
            self.account,
            len(envelope.body),
        )
        return None

    async def aclose(self) -> None:
        return None
