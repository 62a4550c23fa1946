"""Channel capabilities and the provider ids channels return (no network)."""

from __future__ import annotations

import httpx

from mailroom.adapters.channels import ChannelOutbound, discover
from mailroom.adapters.channels.webhook import provider_id
from mailroom.settings import DeliverySettings


def test_each_channel_declares_its_capabilities():
    plugins = discover()
    assert plugins["webhook"].capabilities.idempotent
    assert not plugins["email"].capabilities.idempotent
    outbound = ChannelOutbound(DeliverySettings())
    assert outbound.chunk_size("webhook") is None, "the setting's chunk size applies"
    assert outbound.chunk_size("no-such-channel") is None


def test_a_webhook_answer_names_its_id_in_a_header_or_a_json_body():
    assert provider_id(httpx.Response(200, headers={"X-Message-Id": " abc "})) == "abc"
    assert provider_id(httpx.Response(202, json={"id": 42})) == "42"
    assert provider_id(httpx.Response(200, json={"id": True})) is None
    assert provider_id(httpx.Response(200, json=["id"])) is None
    assert provider_id(httpx.Response(200, text="ok")) is None
    assert len(provider_id(httpx.Response(200, json={"id": "x" * 999})) or "") == 200
