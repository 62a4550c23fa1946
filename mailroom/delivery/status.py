"""Read-only views for operators: counts per status and channel, and the stream's state."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
import redis.exceptions
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.models import ChannelMessage
from mailroom.settings import DeliverySettings


@dataclass(frozen=True)
class StreamState:
    length: int
    #: Entries read by a bridge and not acknowledged yet.
    pending: int
    consumers: int
    #: Whether the consumer group exists yet (created by the first bridge).
    group_exists: bool


async def message_counts(session: AsyncSession) -> list[tuple[str, str, int]]:
    """(status, channel, count) for every combination present, sorted."""
    rows = await session.execute(
        select(ChannelMessage.status, ChannelMessage.channel, func.count())
        .group_by(ChannelMessage.status, ChannelMessage.channel)
        .order_by(ChannelMessage.status, ChannelMessage.channel)
    )
    return [(status, channel, int(count)) for status, channel, count in rows]


async def stream_state(client: aioredis.Redis, settings: DeliverySettings) -> StreamState:
    length = int(await client.xlen(settings.stream_key))
    try:
        groups = await client.xinfo_groups(settings.stream_key)
    except redis.exceptions.ResponseError:  # no such key yet
        groups = []
    for group in groups:
        name = group.get("name")
        if isinstance(name, bytes):
            name = name.decode()
        if name == settings.consumer_group:
            return StreamState(length, int(group["pending"]), int(group["consumers"]), True)
    return StreamState(length, 0, 0, False)
