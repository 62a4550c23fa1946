"""``free_port`` never hands out a port the settings' defaults name."""

from __future__ import annotations

import socket

import pytest

from mailroom.devtools import stack
from mailroom.settings.base import DEV_REDIS_PORT


def test_a_port_the_dev_defaults_name_is_passed_over(monkeypatch):
    # The system offers the dev stack's Redis port first (it is in the ephemeral range)
    offered = iter([DEV_REDIS_PORT, 40123])

    class Socket:
        def __init__(self, *args):
            self.port = next(offered)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(stack.socket, "socket", Socket)

    # Then free_port asks again and gives the next one
    assert stack.free_port() == 40123
    assert DEV_REDIS_PORT in stack.DEV_PORTS


def test_the_dev_ports_are_held_for_the_session_and_refuse_connections():
    # Given the session's hold on the dev ports (this process's or xdist's controller's)
    for port in stack.DEV_PORTS:
        # A server cannot take one
        with socket.socket() as server, pytest.raises(OSError):
            server.bind(("127.0.0.1", port))
        # And a client expecting nothing there is refused, as before
        with socket.socket() as client:
            listening = client.connect_ex(("127.0.0.1", port)) == 0
            assert not listening, f"a server listens on dev port {port}: is `mailroom dev` running?"
