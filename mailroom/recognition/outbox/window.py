"""Flow control's nudge: who runs the publisher again when acks free places in a window.

The outbox publishes at most ``max_unacked_per_pipeline`` requests of a pipeline that
are not yet acked or answered (outbox.py); the rest wait ``queued``. When acks or
results free places, the inbox actors send a publish pass, but only while a window
may hold jobs back: a pass that leaves a window full marks it in Redis for
``WAITING_TTL_S`` (each such pass renews it), so an inbox batch pays one Redis round
trip, not a pass, when nothing waits. The mark is never cleared, only left to expire:
a pass that clears it could race one that sets it.

The passes asked for are coalesced as the notification passes are: an inbox batch
sends one only when none is queued and not yet started (``REQUESTED_TTL_S`` bounds a
lost one). Every inbox batch of a backlog asked for its own pass before, and a queue
of stale passes kept the next mail's publish waiting behind them (p99 APPEND ->
delivered 3.4 s against 1.0 s in ``bench/e2e.py``). A pass clears the request as it
starts, before it claims, so an ack committed after that asks for a new one.
The scheduler's outbox sweep stays the safety net.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from mailroom.adapters.pass_requests import PassRequest
from mailroom.settings import NatsSettings

logger = logging.getLogger(__name__)

#: How long a full window's mark lives, in seconds. In a backlog every ack's pass renews it;
#: after one it keeps acks sending passes for nothing until it expires (mails that come
#: then waited behind those passes). When it lapses with the window still full, no ack came
#: for that long: the service is slower than 1 per 5 s, and the outbox sweep (every 10 s)
#: refills the window and marks it again.
WAITING_TTL_S = 5

#: How long a requested pass keeps further requests back if its message is lost, in seconds.
REQUESTED_TTL_S = 10

#: Inbox outcomes that took a job out of ``published`` (or may have): places freed.
FREEING_OUTCOMES = frozenset({"ack_applied", "result_applied"})


def waiting_key(nats: NatsSettings) -> str:
    """The Redis key of the mark, one per deployment (its stream)."""
    return f"mailroom:{nats.stream_name}:recognition-window-full"


def requested_key(nats: NatsSettings) -> str:
    """The Redis key of the mark that a publish pass is queued and not yet started."""
    return f"mailroom:{nats.stream_name}:recognition-pass-requested"


# Both checks in one round trip: a pass is requested only while a window is marked full.
_REQUEST_IF_WAITING = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then return 1 end
return 2
"""


def frees_places(applied: Iterable[str]) -> bool:
    """True when one of these inbox outcomes acked or answered a job."""
    return any(outcome in FREEING_OUTCOMES for outcome in applied)


async def mark_waiting(redis: aioredis.Redis, nats: NatsSettings) -> None:
    """A pass left a window full: jobs may wait for places acks will free."""
    try:
        await redis.set(waiting_key(nats), "1", ex=WAITING_TTL_S)
    except RedisError as exc:  # acks then send no pass: the outbox sweep refills it
        logger.warning("Full recognition window not recorded: %s", exc)


async def request_pass(redis: aioredis.Redis, nats: NatsSettings) -> bool:
    """True when the caller must send a publish pass: queued jobs may wait behind a full
    window and no pass is queued and not yet started. True when Redis cannot say: a pass
    too many costs less than jobs left waiting for the sweep."""
    keys = (waiting_key(nats), requested_key(nats))
    try:
        return bool(await redis.eval(_REQUEST_IF_WAITING, 2, *keys, REQUESTED_TTL_S) == 1)
    except RedisError as exc:
        logger.warning("Recognition window mark not read (%s); nudging the publisher", exc)
        return True


def publish_pass(nats: NatsSettings) -> PassRequest:
    """The mark of a queued publish pass: intake's nudges ask for one through it too."""
    return PassRequest(requested_key(nats), REQUESTED_TTL_S, "Publish pass")


async def pass_started(redis: aioredis.Redis, nats: NatsSettings) -> None:
    """A publish pass starts: acks and intake's nudges from now on ask for the next one."""
    await publish_pass(nats).started(redis)
