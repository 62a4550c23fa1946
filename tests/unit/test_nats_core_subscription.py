"""The core-NATS result subscription is bounded: pending limits and a small local buffer."""

from __future__ import annotations

import asyncio
from typing import Any

from mailroom.adapters.nats import NatsClient
from mailroom.settings import NatsSettings


class _FakeConnection:
    is_connected = True

    def __init__(self) -> None:
        self.subscribed: dict[str, Any] = {}

    async def subscribe(self, subject: str, **options: Any) -> object:
        self.subscribed = {"subject": subject, **options}
        return object()

    async def flush(self, timeout: float) -> None:
        return None


class _Msg:
    def __init__(self, n: int) -> None:
        self.subject, self.data, self.headers = "files.tabular_parsed", str(n).encode(), None
        self.reply = ""  # core NATS: no reply subject


async def test_core_subscription_passes_its_pending_limits_to_nats():
    settings = NatsSettings(
        jetstream=False, core_pending_msgs_limit=123, core_pending_bytes_limit=4567
    )
    client = NatsClient(settings)
    fake = _FakeConnection()
    client._nc = fake  # type: ignore[assignment]

    await client.subscribe_results()

    assert fake.subscribed["pending_msgs_limit"] == 123
    assert fake.subscribed["pending_bytes_limit"] == 4567
    assert fake.subscribed["queue"] == settings.inbox_queue_group


async def test_a_full_local_buffer_makes_delivery_wait_instead_of_growing():
    client = NatsClient(NatsSettings(jetstream=False, bridge_fetch_batch=2))
    client._nc = _FakeConnection()  # type: ignore[assignment]
    sub = await client.subscribe_results()
    core: Any = sub

    await core.on_message(_Msg(1))
    await core.on_message(_Msg(2))
    third = asyncio.create_task(core.on_message(_Msg(3)))
    await asyncio.sleep(0.01)
    assert not third.done()  # the backlog waits in nats-py's pending queue

    fetched = await sub.fetch(10, timeout_s=1)
    fetched += await sub.fetch(10, timeout_s=1)
    await asyncio.wait_for(third, timeout=1)
    assert [m.data for m in fetched] == [b"1", b"2", b"3"]
