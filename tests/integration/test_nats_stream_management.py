"""The recognition stream on a shared server: created when missing, never rewritten."""

from __future__ import annotations

import uuid

import nats as nats_py
import pytest
from nats.js.api import StorageType, StreamConfig

from mailroom.adapters.nats import NatsClient
from mailroom.errors import NatsConfigError
from mailroom.settings import NatsSettings

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(nats_url, subject_prefix) -> NatsSettings:
    tag = uuid.uuid4().hex[:10]
    return NatsSettings(
        url=nats_url,
        allow_anonymous=True,
        subject_prefix=subject_prefix,
        stream_name=f"S_{tag}",
        inbox_durable=f"inbox_{tag}",
        connect_timeout_s=1.0,
    )


@pytest.fixture
async def js(nats_url):
    nc = await nats_py.connect(servers=[nats_url])
    yield nc.jetstream()
    await nc.close()


async def _connect(settings: NatsSettings) -> None:
    client = NatsClient(settings, name="stream-test")
    try:
        await client.connect()
    finally:
        await client.close()


async def test_a_missing_stream_is_created_with_the_configured_replicas(settings, js):
    await _connect(settings)

    config = (await js.stream_info(settings.stream_name)).config
    assert config.num_replicas == 1
    assert config.storage == StorageType.FILE
    assert len(config.subjects) == 3


async def test_an_existing_stream_gains_missing_subjects_and_keeps_its_own(settings, js):
    # Given an operator's stream with its own subjects and limits
    prefix = settings.subject_prefix
    await js.add_stream(
        StreamConfig(
            name=settings.stream_name,
            subjects=[f"{prefix}files.>", f"{prefix}audit"],
            max_age=60.0,
            max_msgs=1_000,
        )
    )
    other = settings.model_copy(update={"results_subject": "answers.parsed"})

    # When Mailroom connects with a results subject the stream does not capture
    await _connect(other)

    # Then only that subject was added; the rest is as the operator left it
    config = (await js.stream_info(settings.stream_name)).config
    assert config.subjects == [f"{prefix}files.>", f"{prefix}audit", f"{prefix}answers.parsed"]
    assert (config.max_age, config.max_msgs) == (60.0, 1_000)


async def test_a_stream_with_other_replicas_or_memory_storage_is_refused(settings, js):
    await js.add_stream(
        StreamConfig(name=settings.stream_name, subjects=[f"{settings.subject_prefix}>"])
    )
    with pytest.raises(NatsConfigError) as refused:
        await _connect(settings.model_copy(update={"stream_replicas": 3}))
    assert str(refused.value) == (
        f"stream {settings.stream_name} has 1 replicas and "
        "nats.stream_replicas is 3: set nats.stream_replicas to 1 "
        "(Mailroom never changes an existing stream's replicas)"
    )
    await js.delete_stream(settings.stream_name)

    await js.add_stream(
        StreamConfig(
            name=settings.stream_name,
            subjects=[f"{settings.subject_prefix}>"],
            storage=StorageType.MEMORY,
        )
    )
    with pytest.raises(NatsConfigError, match="memory storage: Mailroom needs file storage"):
        await _connect(settings)
    assert (await js.stream_info(settings.stream_name)).config.storage == StorageType.MEMORY


async def test_without_stream_management_only_existing_stream_and_consumer_are_used(settings, js):
    unmanaged = settings.model_copy(update={"manage_stream": False})

    with pytest.raises(NatsConfigError, match=r"does not exist and nats\.manage_stream is false"):
        await _connect(unmanaged)
    assert await _streams(js, settings.stream_name) == []

    await js.add_stream(
        StreamConfig(name=settings.stream_name, subjects=[f"{settings.subject_prefix}>"])
    )
    with pytest.raises(NatsConfigError, match=f"consumer {settings.inbox_durable} of stream"):
        await _connect(unmanaged)

    # Once the operator made both, the bridge binds to the consumer as it is
    await _connect(settings)
    client = NatsClient(settings)
    await client.connect()
    subscription = await client.subscribe_results()  # creates the durable consumer
    await subscription.close()
    await client.close()
    bound = NatsClient(unmanaged)
    await bound.connect()
    subscription = await bound.subscribe_results()
    assert await subscription.fetch(1, 0.2) == []
    await subscription.close()
    await bound.close()


async def _streams(js, name: str) -> list[str]:
    return [info.config.name for info in await js.streams_info() if info.config.name == name]
