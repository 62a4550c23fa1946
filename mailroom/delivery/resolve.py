"""Resolve: an operator says what became of an uncertain message (audit-logged).

An ``uncertain`` message went to a channel without idempotency keys from an attempt that
died before it recorded the answer: it may have arrived or not. Sending it again risks a
duplicate, so a person who asked the receiver settles it: ``delivered`` (it arrived) or
``failed`` (it did not; ``delivery replay`` then sends it). Both are final, so the
deliverer leaves the message alone from then on.
"""

from __future__ import annotations

import logging
from typing import Literal

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.db.audit import OPERATOR, add_audit_event
from mailroom.db.clock import db_now
from mailroom.db.engine import transaction
from mailroom.db.models import ChannelMessage
from mailroom.errors import NotResolvable

logger = logging.getLogger(__name__)

Outcome = Literal["delivered", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("delivered", "failed")
#: What a message resolved as not received records as its error.
NOT_RECEIVED = "resolved by an operator: the receiver did not get it"


async def resolve_message(
    sessions: async_sessionmaker[AsyncSession], *, message_id: int, outcome: Outcome, actor_id: str
) -> None:
    """Settle uncertain message ``message_id`` as ``outcome``; ``NotResolvable`` otherwise."""
    if outcome not in OUTCOMES:
        raise NotResolvable(f"resolve as delivered or failed, not {outcome!r}")
    async with transaction(sessions) as session:
        status = await session.scalar(
            select(ChannelMessage.status).where(ChannelMessage.id == message_id).with_for_update()
        )
        if status is None:
            raise NotResolvable(f"message {message_id} does not exist")
        if status != "uncertain":
            raise NotResolvable(f"message {message_id} is {status}, not uncertain")
        now = await db_now(session)
        values: dict[str, object] = {"status": outcome, "sending_since": None}
        if outcome == "delivered":
            values["delivered_at"] = now
        else:
            values["last_error"] = NOT_RECEIVED
        await session.execute(
            update(ChannelMessage).where(ChannelMessage.id == message_id).values(**values)
        )
        add_audit_event(
            session,
            actor_type=OPERATOR,
            actor_id=actor_id[:200],
            action="delivery.resolved",
            target=f"channel_message:{message_id}",
            detail={"previous_status": status, "outcome": outcome},
        )
    logger.info("Message %d resolved as %s by %r", message_id, outcome, actor_id[:100])
