"""S3 and NATS clients carry the time bounds of their settings."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from mailroom.adapters.nats import NatsClient
from mailroom.adapters.storage import S3Store
from mailroom.settings import NatsSettings, StorageSettings

pytestmark = pytest.mark.integration


def test_the_s3_client_has_connect_and_read_timeouts_and_bounded_retries():
    settings = StorageSettings(
        kind="s3",
        s3_endpoint_url="http://127.0.0.1:9",
        s3_access_key="k",
        s3_secret_key=SecretStr("s"),
        s3_connect_timeout_s=3.0,
        s3_read_timeout_s=12.0,
        s3_retries=1,
    )
    config = S3Store(settings)._client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (3.0, 12.0)
    assert config.retries["total_max_attempts"] == 2  # the first try and one retry


async def test_the_nats_client_pings_often_enough_to_notice_a_silent_server(nats_url):
    client = NatsClient(
        NatsSettings(
            url=nats_url,
            allow_anonymous=True,
            jetstream=False,
            ping_interval_s=3.0,
            max_outstanding_pings=2,
        )
    )
    await client.connect()
    try:
        options = client._nc.options  # type: ignore[union-attr]
        assert (options["ping_interval"], options["max_outstanding_pings"]) == (3.0, 2)
    finally:
        await client.close()
