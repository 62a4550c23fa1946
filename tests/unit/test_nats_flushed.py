"""``flushed`` puts its PING after the commands sent before it; nats-py's ``flush`` does not.

A server of a few lines records the bytes in the order they arrive and answers each PING.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest

from mailroom.service.wire import flushed

INFO = b'INFO {"server_id":"t","version":"2.10.0","max_payload":1048576,"headers":true}\r\n'


class Recorder:
    def __init__(self) -> None:
        self.wire = bytearray()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(INFO)
        await writer.drain()
        while line := await reader.readline():
            self.wire.extend(line)
            if line == b"PING\r\n":
                writer.write(b"PONG\r\n")
                await writer.drain()
        writer.close()

    def after_connecting(self) -> bytes:
        """What came after the handshake (CONNECT and its PING)."""
        return bytes(self.wire).split(b"PING\r\n", 1)[1]


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[Recorder, nats.NATS]]:
    recorder = Recorder()
    server = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)
    yield recorder, nc
    await nc.close()
    server.close()
    await server.wait_closed()


async def test_a_subscription_is_on_the_wire_before_the_ping_that_confirms_it(recorded) -> None:
    recorder, nc = recorded
    await nc.subscribe("files.tabular_uploaded", queue="mailroom-recognizer")
    await nc.publish("files.tabular_parsed", b"answer")

    await flushed(nc, timeout_s=5)

    wire = recorder.after_connecting()
    assert wire.index(b"SUB files.tabular_uploaded") < wire.index(b"PING")
    assert wire.index(b"PUB files.tabular_parsed") < wire.index(b"PING")


async def test_nats_py_flush_alone_sends_its_ping_ahead_of_a_subscription(recorded) -> None:
    # Why ``flushed`` exists: should nats-py ever order these, this fails and it can go.
    recorder, nc = recorded
    await nc.subscribe("files.tabular_uploaded")

    await nc.flush(timeout=5)
    await flushed(nc, timeout_s=5)  # the SUB arrives after all

    wire = recorder.after_connecting()
    assert wire.index(b"PING") < wire.index(b"SUB files.tabular_uploaded")
