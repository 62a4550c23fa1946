"""A refused login whose connection the client saw reset first is still one line, no outage.

A server refusing credentials sends ``-ERR 'Authorization Violation'`` and closes; on a
loaded machine the client once read the reset before the error, and the recognizer logged
"NATS … is unreachable" before its refusal line. A server of a few lines does both in turn.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import pytest

from mailroom.errors import NatsLoginRefused
from mailroom.recognizer.connect import connect
from mailroom.settings import NatsSettings

INFO = b'INFO {"server_id":"t","version":"2.10.0","max_payload":1048576,"auth_required":true}\r\n'


class RefusingServer:
    """Resets the first connection after CONNECT; refuses the login of the next ones."""

    def __init__(self) -> None:
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(INFO)
        await writer.drain()
        await reader.readline()  # CONNECT
        if self.connections == 1:
            sock = writer.get_extra_info("socket")
            # Linger 0: the close is a reset, as the client sometimes sees a refusal.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        writer.write(b"-ERR 'Authorization Violation'\r\n")
        await writer.drain()
        writer.close()


async def test_a_reset_before_the_refusal_is_not_reported_as_an_outage(caplog) -> None:
    server = RefusingServer()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    settings = NatsSettings(
        url=f"nats://127.0.0.1:{port}", user="mailroom", password="wrong", connect_timeout_s=2.0
    )

    async def closed() -> None:
        return None

    try:
        with caplog.at_level(logging.INFO), pytest.raises(NatsLoginRefused):
            await asyncio.wait_for(connect(settings, name="t", on_closed=closed), 30)
    finally:
        listener.close()
        await listener.wait_closed()

    assert server.connections >= 2
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
