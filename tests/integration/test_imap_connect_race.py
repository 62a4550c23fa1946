"""A connect that close() overtakes ends its own connection instead of leaking it."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from pydantic import SecretStr

from mailroom.adapters.imap import ImapMailbox
from mailroom.errors import MailboxUnavailable
from mailroom.settings import MailboxSettings

pytestmark = pytest.mark.integration


class SlowGreeter:
    """A TCP server that accepts at once but sends the IMAP greeting only when told."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = threading.Event()
        self.conn: socket.socket | None = None

    def accept(self) -> None:
        self.conn, _ = self.listener.accept()
        self.accepted.set()

    def greet_and_wait_for_close(self, timeout_s: float) -> bool:
        """Send the greeting; True when the client then closes the connection."""
        assert self.conn is not None
        self.conn.sendall(b"* OK [CAPABILITY IMAP4rev1] ready\r\n")
        self.conn.settimeout(timeout_s)
        try:
            while True:
                data = self.conn.recv(4096)
                if not data:
                    return True
                if b"CAPABILITY" in data:  # imapclient asks before LOGIN on some paths
                    tag = data.split(b" ", 1)[0]
                    self.conn.sendall(b"* CAPABILITY IMAP4rev1\r\n" + tag + b" OK done\r\n")
        except TimeoutError:
            return False

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


async def test_close_during_connect_leaves_no_live_connection():
    server = SlowGreeter()
    accepting = threading.Thread(target=server.accept, daemon=True)
    accepting.start()
    settings = MailboxSettings(
        name="race",
        host="127.0.0.1",
        port=server.port,
        security="plain",
        username="u",
        password=SecretStr("p"),
        timeout_s=10,
    )
    box = ImapMailbox(settings)
    try:
        connecting = asyncio.create_task(box.connect())
        assert await asyncio.to_thread(server.accepted.wait, 5)
        # The connect thread now waits for the greeting; the poll is cancelled and closes.
        connecting.cancel()
        closing = asyncio.create_task(box.close())
        await asyncio.sleep(0.2)
        # The greeting arrives after close(): the connecting thread must end the connection.
        assert await asyncio.to_thread(server.greet_and_wait_for_close, 5)
        await closing
        with pytest.raises((asyncio.CancelledError, MailboxUnavailable)):
            await connecting
        assert box._client is None
    finally:
        server.close()
