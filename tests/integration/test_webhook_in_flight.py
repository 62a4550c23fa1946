"""An account's webhook requests in flight are capped per process, by its session's connector.

A real HTTP/1.1 server on loopback holds every request until the test lets them go,
so what it sees at once is what the channel has in flight.
"""

from __future__ import annotations

import asyncio

import pytest

from mailroom.adapters.channels.webhook import WebhookChannel
from mailroom.delivery.ports import Envelope
from mailroom.errors import ChannelUnavailable
from mailroom.settings import DeliverySettings, WebhookAccount

pytestmark = pytest.mark.integration


def _content_length(head: bytes) -> int:
    return next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )


class HoldingReceiver:
    """Answers 200 to each POST once ``release`` is set (after ``delay_s`` when given);
    counts requests and connections."""

    def __init__(self, delay_s: float | None = None) -> None:
        self.release = asyncio.Event()
        self.delay_s = delay_s
        self.in_flight = 0
        self.peak = 0
        self.answered = 0
        self.connections = 0
        self.reached = asyncio.Event()
        self.expect = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                await reader.readexactly(_content_length(head))
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
                if self.in_flight == self.expect:
                    self.reached.set()
                if self.delay_s is None:
                    await self.release.wait()
                else:
                    await asyncio.sleep(self.delay_s)
                self.in_flight -= 1
                self.answered += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_requests_in_flight_stop_at_the_accounts_cap_and_the_rest_wait():
    receiver = HoldingReceiver()
    receiver.expect = 12
    server = await asyncio.start_server(receiver.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = DeliverySettings(
        webhook_accounts={
            "default": WebhookAccount(url=f"http://127.0.0.1:{port}/hook", max_in_flight=12)
        },
        webhook_allowed_hosts=["127.0.0.1"],
        webhook_allow_http=True,
    )
    channel = WebhookChannel("default", settings)
    sends = [
        asyncio.create_task(
            channel.send(Envelope(n, "webhook", "default", "ops", "Invoice", "total", 1, 1))
        )
        for n in range(40)
    ]
    try:
        await asyncio.wait_for(receiver.reached.wait(), 10)
        # Every other send has had its turns of the loop to get past the cap, if it could.
        for _ in range(50):
            await asyncio.sleep(0)
        assert receiver.in_flight == 12
        assert receiver.answered == 0
        # One connection per request in flight, all of the channel's one session.
        assert receiver.connections == 12
        assert channel._session is not None and channel._session.connector.limit == 12
        receiver.release.set()
        await asyncio.wait_for(asyncio.gather(*sends), 10)
        assert receiver.answered == 40
        assert receiver.peak == 12
        # The waiting sends reused the connections the first ones opened.
        assert receiver.connections == 12
    finally:
        receiver.release.set()
        for task in sends:
            task.cancel()
        await asyncio.gather(*sends, return_exceptions=True)
        await channel.aclose()
        server.close()
        await server.wait_closed()


async def test_a_wait_for_a_connection_longer_than_the_timeout_is_not_a_timeout():
    # One request at a time, each answered well within the timeout: the last of 12 waits
    # about twice the timeout for its turn, and is still sent, not failed unsent.
    receiver = HoldingReceiver(delay_s=0.1)
    server = await asyncio.start_server(receiver.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    account = WebhookAccount(url=f"http://127.0.0.1:{port}/hook", max_in_flight=1, timeout_s=0.6)
    settings = DeliverySettings(
        webhook_accounts={"default": account},
        webhook_allowed_hosts=["127.0.0.1"],
        webhook_allow_http=True,
    )
    channel = WebhookChannel("default", settings)
    try:
        envelopes = [
            Envelope(n, "webhook", "default", "ops", "Invoice", "", 1, 1) for n in range(12)
        ]
        outcomes = await asyncio.gather(
            *(channel.send(e) for e in envelopes), return_exceptions=True
        )
        assert [o for o in outcomes if isinstance(o, BaseException)] == []
        assert receiver.answered == 12 and receiver.peak == 1
    finally:
        await channel.aclose()
        server.close()
        await server.wait_closed()


def test_the_cap_is_a_positive_count():
    with pytest.raises(ValueError, match="greater than 0"):
        WebhookAccount(url="http://127.0.0.1/hook", max_in_flight=0)


async def test_a_send_on_a_closed_channel_is_retryable_and_opens_no_session():
    # What a lane still holding a chain that an account reload replaced (and closed) sees.
    settings = DeliverySettings(
        webhook_accounts={"default": WebhookAccount(url="http://127.0.0.1:9/hook")},
        webhook_allowed_hosts=["127.0.0.1"],
        webhook_allow_http=True,
    )
    channel = WebhookChannel("default", settings)
    await channel.aclose()
    with pytest.raises(ChannelUnavailable, match="closed"):
        await channel.send(Envelope(1, "webhook", "default", "ops", "Invoice", "total", 1, 1))
    assert channel._session is None
