"""Redis for delivery: stream entries, processing locks, delivered keys, token buckets.

Compare-and-set operations run as Lua scripts so each is one atomic round trip;
``redis-py`` re-loads a script after a server restart (``NOSCRIPT``) by itself.
Connection errors leave this module as ``ServiceUnavailable``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import redis.asyncio as aioredis
import redis.exceptions

from mailroom.delivery.contracts import encode_entry
from mailroom.errors import ServiceUnavailable

# Take the lock, unless the message is already settled; re-take a lock we own.
# KEYS: delivered key, lock key. ARGV: token, ttl_ms.
# Returns {"delivered"} | {"acquired"} | {"retaken"} | {"held", current owner}.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'delivered'}
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {'acquired'}
end
local owner = redis.call('GET', KEYS[2])
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {'retaken'}
end
return {'held', owner or ''}
"""

# Settle: optionally set the delivered key, then drop the lock if it is still ours.
# KEYS: lock key, delivered key. ARGV: token, delivered value ('' for none), delivered ttl_s.
_SETTLE = """
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# The batch forms of acquire and settle, and lock renewal: one round trip for many messages.
# KEYS: delivered key and lock key of each message, in pairs. ARGV: token, ttl_ms.
# Returns one JSON string (one cheap parse) of one reply of _ACQUIRE per message, in order.
_ACQUIRE_MANY = """
local replies = {}
for i = 1, #KEYS, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    replies[#replies + 1] = {'delivered'}
  elseif redis.call('SET', KEYS[i + 1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    replies[#replies + 1] = {'acquired'}
  else
    local owner = redis.call('GET', KEYS[i + 1])
    if owner == ARGV[1] then
      redis.call('PEXPIRE', KEYS[i + 1], ARGV[2])
      replies[#replies + 1] = {'retaken'}
    else
      replies[#replies + 1] = {'held', owner or ''}
    end
  end
end
return cjson.encode(replies)
"""

# KEYS: lock keys. ARGV: token, ttl_ms. Returns 1 (extended) or 0 (not ours) per key.
_EXTEND_MANY = """
local replies = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    replies[i] = redis.call('PEXPIRE', KEYS[i], ARGV[2])
  else
    replies[i] = 0
  end
end
return replies
"""

# KEYS: lock key and delivered key of each message, in pairs. ARGV: token, delivered ttl_s,
# then the delivered value of each message ('' for none).
_SETTLE_MANY = """
for i = 1, #KEYS, 2 do
  local value = ARGV[2 + (i + 1) / 2]
  if value ~= '' then
    redis.call('SET', KEYS[i + 1], value, 'EX', ARGV[2])
  end
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
  end
end
return #KEYS / 2
"""

# XREADGROUP of new entries, returned packed as one JSON string of [[entry id, payload], ...]
# (payload false when the entry has none). A nested RESP reply costs redis.asyncio's pure-Python
# parser about eight reads per entry; one string is one read and a C json.loads. Entries
# forwarded earlier can be acknowledged (XACK + XDEL) in the same round trip.
# KEYS: stream. ARGV: group, consumer, count, then the entry ids to acknowledge first.
READ_NEW_PACKED = """
if #ARGV > 3 then
  local done = {unpack(ARGV, 4)}
  redis.call('XACK', KEYS[1], ARGV[1], unpack(done))
  redis.call('XDEL', KEYS[1], unpack(done))
end
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                         'STREAMS', KEYS[1], '>')
if not reply then
  return '[]'
end
local out = {}
for _, entry in ipairs(reply[1][2]) do
  local payload = false
  local fields = entry[2]
  if fields then
    for j = 1, #fields, 2 do
      if fields[j] == 'payload' then
        payload = fields[j + 1]
      end
    end
  end
  out[#out + 1] = {entry[1], payload}
end
if #out == 0 then
  return '[]'
end
return cjson.encode(out)
"""

# Token bucket: KEYS: bucket hash. ARGV: rate per second, burst, cost.
# Returns 0 when the tokens were taken, else the wait until they would be, in milliseconds.
_TOKEN_BUCKET = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
else
  wait = math.ceil((cost - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return wait
"""

#: Redis errors that mean "not reachable now" rather than "wrong command".
CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    OSError,
)


@asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    """Turn connection-level Redis errors into ``ServiceUnavailable``."""
    try:
        yield
    except CONNECTION_ERRORS as exc:
        raise ServiceUnavailable(f"redis unavailable: {exc}") from exc


@dataclass(frozen=True)
class DeliveryKeys:
    """Names of the delivery keys, all under the stream key so tests can isolate them."""

    stream: str

    def lock(self, message_id: int) -> str:
        return f"{self.stream}:lock:{message_id}"

    def delivered(self, message_id: int) -> str:
        return f"{self.stream}:delivered:{message_id}"

    def bucket(self, channel: str, account: str) -> str:
        return f"{self.stream}:bucket:{channel}:{account}"


@dataclass(frozen=True)
class AcquireResult:
    """What ``acquire_lock`` found: ``delivered``, ``acquired``, ``retaken`` or ``held``."""

    state: str
    holder: str = ""

    @property
    def ours(self) -> bool:
        return self.state in ("acquired", "retaken")


#: The results without a holder, built once: one per message was a cost of its own.
_STATES = {state: AcquireResult(state) for state in ("delivered", "acquired", "retaken")}


def _acquire_result(reply: list[str]) -> AcquireResult:
    found = _STATES.get(reply[0]) if len(reply) == 1 else None
    return found if found is not None else AcquireResult(*reply)


class DeliveryRedis:
    """The delivery pipeline's Redis operations over one ``redis.asyncio`` client."""

    def __init__(self, client: aioredis.Redis, *, stream_key: str) -> None:
        self.client = client
        self.keys = DeliveryKeys(stream_key)
        self._acquire = client.register_script(_ACQUIRE)
        self._settle = client.register_script(_SETTLE)
        self._acquire_many = client.register_script(_ACQUIRE_MANY)
        self._extend_many = client.register_script(_EXTEND_MANY)
        self._settle_many = client.register_script(_SETTLE_MANY)
        self._bucket = client.register_script(_TOKEN_BUCKET)

    async def add_to_stream(self, message_ids: Iterable[int], *, maxlen: int) -> None:
        """XADD one entry per id in one pipeline, trimming the stream to about ``maxlen``."""
        ids = list(message_ids)
        if not ids:
            return
        async with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for message_id in ids:
                pipe.xadd(
                    self.keys.stream,
                    encode_entry(message_id),  # type: ignore[arg-type]
                    maxlen=maxlen,
                    approximate=True,
                )
            await pipe.execute()

    async def is_settled(self, message_id: int) -> bool:
        async with translate_errors():
            return bool(await self.client.exists(self.keys.delivered(message_id)))

    async def acquire_lock(self, message_id: int, *, token: str, ttl_ms: int) -> AcquireResult:
        async with translate_errors():
            reply = await self._acquire(
                keys=[self.keys.delivered(message_id), self.keys.lock(message_id)],
                args=[token, ttl_ms],
            )
        state = _text(reply[0])
        holder = _text(reply[1]) if len(reply) > 1 else ""
        return AcquireResult(state, holder)

    async def settle(
        self, message_id: int, *, token: str, delivered: str = "", delivered_ttl_s: int = 0
    ) -> None:
        """Set the delivered key (when ``delivered`` is given) and release our lock."""
        async with translate_errors():
            await self._settle(
                keys=[self.keys.lock(message_id), self.keys.delivered(message_id)],
                args=[token, delivered, max(1, delivered_ttl_s)],
            )

    async def acquire_locks(
        self, message_ids: Sequence[int], *, token: str, ttl_ms: int
    ) -> dict[int, AcquireResult]:
        """``acquire_lock`` for many messages in one atomic round trip."""
        if not message_ids:
            return {}
        keys: list[str] = []
        for message_id in message_ids:
            keys += (self.keys.delivered(message_id), self.keys.lock(message_id))
        async with translate_errors():
            replies = json.loads(await self._acquire_many(keys=keys, args=[token, ttl_ms]))
        return {
            message_id: _acquire_result(reply)
            for message_id, reply in zip(message_ids, replies, strict=True)
        }

    async def extend_locks(
        self, message_ids: Sequence[int], *, token: str, ttl_ms: int
    ) -> set[int]:
        """Extend those of our locks that are still ours; returns their ids."""
        if not message_ids:
            return set()
        async with translate_errors():
            replies = await self._extend_many(
                keys=[self.keys.lock(mid) for mid in message_ids], args=[token, ttl_ms]
            )
        return {mid for mid, ok in zip(message_ids, replies, strict=True) if ok}

    async def settle_many(
        self, delivered: Sequence[tuple[int, str]], *, token: str, delivered_ttl_s: int
    ) -> None:
        """``settle`` for many messages: (id, delivered value or '') pairs, one round trip."""
        if not delivered:
            return
        keys: list[str] = []
        for message_id, _ in delivered:
            keys += (self.keys.lock(message_id), self.keys.delivered(message_id))
        async with translate_errors():
            await self._settle_many(
                keys=keys, args=[token, max(1, delivered_ttl_s), *(v for _, v in delivered)]
            )

    async def live_locks(self, message_ids: Sequence[int]) -> set[int]:
        """Which of ``message_ids`` have a processing lock right now."""
        if not message_ids:
            return set()
        async with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for message_id in message_ids:
                pipe.exists(self.keys.lock(message_id))
            found = await pipe.execute()
        return {mid for mid, exists in zip(message_ids, found, strict=True) if exists}

    async def forget_settled(self, message_ids: Sequence[int]) -> None:
        """Drop delivered keys so replayed messages are sent again."""
        if not message_ids:
            return
        async with translate_errors():
            await self.client.delete(*(self.keys.delivered(mid) for mid in message_ids))

    async def take_tokens(
        self, channel: str, account: str, *, per_second: float, burst: int, cost: int = 1
    ) -> int:
        """Take ``cost`` tokens from the bucket; 0 on success, else the wait in milliseconds."""
        async with translate_errors():
            wait = await self._bucket(
                keys=[self.keys.bucket(channel, account)], args=[per_second, burst, cost]
            )
        return int(wait)


def unpack_entries(raw: bytes | str) -> list[tuple[str, str | None]] | None:
    """The (entry id, payload) pairs of a ``READ_NEW_PACKED`` reply; None when undecodable.

    Undecodable (a payload that is not UTF-8) means the entries are in the
    consumer's pending list already: read them again with a plain XREADGROUP.
    """
    try:
        pairs = json.loads(raw)
    except ValueError:
        return None
    return [
        (str(entry_id), payload if isinstance(payload, str) else None)
        for entry_id, payload in pairs
    ]


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def describe_holder(raw: str) -> str:
    """A short, safe description of a lock owner for logs."""
    try:
        owner = json.loads(raw)
    except ValueError:
        return repr(raw[:80])
    return repr(str(owner.get("owner", "?"))[:80]) if isinstance(owner, dict) else repr(raw[:80])
