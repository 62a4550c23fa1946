"""Channel capabilities and the provider ids channels return (no network)."""

from __future__ import annotations

import json

from mailroom.adapters.channels import ChannelOutbound, discover
from mailroom.adapters.channels.webhook import Reply, provider_id
from mailroom.settings import DeliverySettings


def test_each_channel_declares_its_capabilities():
    plugins = discover()
    assert plugins["webhook"].capabilities.idempotent
    assert not plugins["email"].capabilities.idempotent
    outbound = ChannelOutbound(DeliverySettings())
    assert outbound.is_idempotent("webhook") and not outbound.is_idempotent("no-such-channel")


def answer(status: int, *, headers: dict[str, str] | None = None, **body: object) -> Reply:
    """An answer with ``json=`` (sent as application/json) or ``text=`` (text/plain)."""
    if "json" in body:
        return Reply(
            status, "", {"Content-Type": "application/json"}, json.dumps(body["json"]).encode()
        )
    return Reply(
        status, "", headers or {"Content-Type": "text/plain"}, str(body.get("text", "")).encode()
    )


def test_a_webhook_answer_names_its_id_in_a_header_or_a_json_body():
    assert provider_id(answer(200, headers={"X-Message-Id": " abc "})) == "abc"
    assert provider_id(answer(202, json={"id": 42})) == "42"
    assert provider_id(answer(200, json={"id": True})) is None
    assert provider_id(answer(200, json=["id"])) is None
    assert provider_id(answer(200, text="ok")) is None
    assert len(provider_id(answer(200, json={"id": "x" * 999})) or "") == 200
    # A body longer than the channel reads for an id is not parsed.
    assert provider_id(Reply(200, "", {"Content-Type": "application/json"}, None)) is None
