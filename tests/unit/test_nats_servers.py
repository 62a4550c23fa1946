"""The NATS server list: one URL or several, each checked before nats-py sees it."""

from __future__ import annotations

import pytest

from mailroom.adapters.nats import NatsClient
from mailroom.adapters.nats.login import server_urls
from mailroom.errors import NatsUnavailable
from mailroom.settings import NatsSettings


def test_servers_replace_the_single_url():
    settings = NatsSettings(servers=["nats://a:4222", "nats://b:4222"])
    assert server_urls(settings) == ["nats://a:4222", "nats://b:4222"]
    assert server_urls(NatsSettings(url="tls://a:4222")) == ["tls://a:4222"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            NatsSettings(url="nats://a:4222,nats://b:4222"),
            "nats.url: 'nats://a:4222,nats://b:4222' is not a NATS server URL "
            "(one server per entry); give several servers as nats.servers",
        ),
        (
            NatsSettings(url="nats://:abc"),
            "nats.url: 'nats://:abc' is not a NATS server URL "
            "(Port could not be cast to integer value as 'abc')",
        ),
        (
            NatsSettings(servers=["nats://a:1", "http://b:2"]),
            "nats.servers: 'http://b:2' is not a NATS server URL "
            "(scheme must be nats://, tls://, ws:// or wss://)",
        ),
        (
            NatsSettings(servers=["nats://a:1", "ws://b:2"]),
            "nats.servers: mixes websocket and nats/tls URLs; use one kind",
        ),
        (
            NatsSettings(url="nats://u:secret@:4222"),
            "nats.url: 'nats://u:***@:4222' is not a NATS server URL (no host)",
        ),
    ],
)
async def test_a_bad_server_url_fails_in_one_line(settings, message):
    with pytest.raises(NatsUnavailable) as failed:
        await NatsClient(settings).connect()
    assert str(failed.value) == message
