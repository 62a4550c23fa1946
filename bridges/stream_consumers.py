"""The delivery group's consumers that are gone: deleted once idle with nothing pending.

Each stream bridge reads as a consumer named ``host-pid``, so every restart of a bridge, on
every host, leaves one consumer behind in the group, and ``XINFO CONSUMERS`` (and
``mailroom status``'s count of bridges) grows without end. The bridge deletes, at each of
its claims, the consumers other than itself that have no pending entry and have been idle
for ``delivery.consumer_forget_after_s``. Checked and deleted in one script, so an entry
delivered to a consumer in between keeps it: ``XGROUP DELCONSUMER`` would drop its pending
entries from the group. A live bridge that was deleted while quiet is created again by its
next read.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from mailroom.settings import DeliverySettings

# KEYS[1] stream; ARGV[1] group, ARGV[2] the caller's own consumer, ARGV[3] least idle ms.
_FORGET = """
local forgotten = {}
for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local field = {}
  for i = 1, #consumer, 2 do field[consumer[i]] = consumer[i + 1] end
  if field['name'] ~= ARGV[2] and field['pending'] == 0
      and field['idle'] >= tonumber(ARGV[3]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], field['name'])
    table.insert(forgotten, field['name'])
  end
end
return forgotten
"""


class IdleConsumers:
    """Deletes the group's idle consumers with nothing pending (see the module's docstring)."""

    def __init__(self, client: aioredis.Redis, settings: DeliverySettings) -> None:
        self.settings = settings
        self._forget = client.register_script(_FORGET)

    async def forget(self, *, keep: str) -> list[str]:
        """Delete them, never ``keep`` (the caller); their names."""
        names: list[Any] = await self._forget(
            keys=[self.settings.stream_key],
            args=[
                self.settings.consumer_group,
                keep,
                int(self.settings.consumer_forget_after_s * 1000),
            ],
        )
        return [name.decode() if isinstance(name, bytes) else str(name) for name in names]
