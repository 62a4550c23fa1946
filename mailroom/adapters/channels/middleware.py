"""The outbound middleware chain around a channel, and the rate-limit middleware.

A middleware wraps the next ``send``; a factory decides per (channel, account)
whether it applies. The chain is built once per (channel, account) by
``ChannelOutbound`` and cached there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.ports import Envelope, Send
from mailroom.errors import Throttled
from mailroom.settings import DeliverySettings


class OutboundMiddleware(Protocol):
    def wrap(self, send: Send) -> Send: ...


#: Returns the middleware for (channel, account), or None when it does not apply.
MiddlewareFactory = Callable[
    [str, str, DeliverySettings, DeliveryRedis | None], OutboundMiddleware | None
]


class RateLimit:
    """A token bucket in Redis shared by every worker: ``per_second`` sends, bursts of ``burst``."""

    def __init__(
        self, redis: DeliveryRedis, *, channel: str, account: str, per_second: float, burst: int
    ) -> None:
        if per_second <= 0:
            raise ValueError("per_second must be positive")
        self.redis = redis
        self.channel = channel
        self.account = account
        self.per_second = per_second
        self.burst = max(1, burst)

    def wrap(self, send: Send) -> Send:
        async def limited(envelope: Envelope) -> str | None:
            wait_ms = await self.redis.take_tokens(
                self.channel, self.account, per_second=self.per_second, burst=self.burst
            )
            if wait_ms > 0:
                raise Throttled(
                    f"rate limit of {self.channel}:{self.account} reached",
                    retry_after_s=wait_ms / 1000,
                )
            return await send(envelope)

        return limited


def rate_limit(
    channel: str, account: str, settings: DeliverySettings, redis: DeliveryRedis | None
) -> RateLimit | None:
    """The rate limit of ``settings.rate_limits["channel:account"]``, if it names one."""
    limit = settings.rate_limits.get(f"{channel}:{account}")
    if limit is None:
        return None
    if redis is None:
        raise ValueError(f"rate limit for {channel}:{account} needs a Redis client")
    return RateLimit(
        redis, channel=channel, account=account, per_second=limit.per_second, burst=limit.burst
    )


def default_middleware() -> list[MiddlewareFactory]:
    """The chain every channel gets, outermost first."""
    return [rate_limit]
