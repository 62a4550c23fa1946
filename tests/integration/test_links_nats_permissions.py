"""Trusted results: nats-server runs deploy/nats-server.conf (on a free port and a temporary
store), `mailroom nats setup` makes the stream and consumer with the administrator's login,
Mailroom works with its runtime user, which cannot change JetStream, and only the recognizer's
user can publish a result."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest

from mailroom.adapters.nats import NatsClient, OutgoingMessage
from mailroom.adapters.nats.login import connect_options
from mailroom.errors import NatsUnavailable
from mailroom.service.wire import flushed
from mailroom.settings import NatsSettings
from tests.fixtures.links import ConfiguredNats

pytestmark = pytest.mark.integration

DEPLOY_CONFIG = Path(__file__).parents[2] / "deploy" / "nats-server.conf"
DEPLOY_STORE_DIR = "store_dir: /data/jetstream"
PASSWORDS = {
    "mailroom-admin": "admin-pass-0",
    "mailroom": "mailroom-pass-1",
    "recognizer": "recognizer-pass-2",
}


@pytest.fixture(scope="module")
def deployed_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfiguredNats]:
    env = {
        "MAILROOM_NATS_ADMIN_PASSWORD": PASSWORDS["mailroom-admin"],
        "MAILROOM_NATS_PASSWORD": PASSWORDS["mailroom"],
        "RECOGNIZER_NATS_PASSWORD": PASSWORDS["recognizer"],
    }
    folder = tmp_path_factory.mktemp("nats-deploy")
    # The deployed file as it is, but for its JetStream store (nats-server refuses -sd beside
    # a store_dir); the port is given on the command line.
    deployed = DEPLOY_CONFIG.read_text()
    assert deployed.count(DEPLOY_STORE_DIR) == 1
    config = folder / "nats-server.conf"
    config.write_text(deployed.replace(DEPLOY_STORE_DIR, f'store_dir: "{folder / "jetstream"}"'))
    server = ConfiguredNats(folder, config, env).start()
    yield server
    server.stop()


def _settings(server: ConfiguredNats, user: str, **overrides: object) -> NatsSettings:
    values: dict[str, object] = {
        "url": server.url_for(),
        "user": user,
        "password": PASSWORDS[user],
        # The deployed configuration names the default subjects and stream: a stream name per
        # test would need its own permissions, so the tests share it and use unique ids.
        "inbox_durable": "mailroom-inbox",
        "connect_timeout_s": 1.0,
        "reconnect_wait_s": 0.1,
        "initial_connect_attempts": 1,
    }
    return NatsSettings(**{**values, **overrides})


class _Side:
    """A raw connection as one user, with the server's errors (permission violations)."""

    def __init__(self, nc: nats.NATS, errors: asyncio.Queue[Exception]) -> None:
        self.nc, self.errors = nc, errors

    async def violation(self) -> str:
        return str(await asyncio.wait_for(self.errors.get(), 5.0))


@pytest.fixture
async def connect_as(deployed_nats) -> AsyncIterator:
    sides: list[_Side] = []

    async def connect(user: str) -> _Side:
        errors: asyncio.Queue[Exception] = asyncio.Queue()

        async def on_error(exc: Exception) -> None:
            errors.put_nowait(exc)

        settings = _settings(deployed_nats, user)
        nc = await nats.connect(
            settings.url, error_cb=on_error, allow_reconnect=False, **connect_options(settings)
        )
        sides.append(_Side(nc, errors))
        return sides[-1]

    yield connect
    for side in sides:
        await side.nc.close()


async def _set_up(server: ConfiguredNats) -> list[str]:
    """What `mailroom nats setup` does, with the administrator's login."""
    admin = NatsClient(_settings(server, "mailroom-admin"), name="mailroom-nats-setup")
    await admin.connect()
    try:
        return await admin.set_up()
    finally:
        await admin.close()


@pytest.fixture
async def mailroom(deployed_nats) -> AsyncIterator[NatsClient]:
    await _set_up(deployed_nats)
    runtime = _settings(deployed_nats, "mailroom", manage_stream=False)
    client = NatsClient(runtime, name="mailroom-test")
    await client.connect()  # checks that the stream and the inbox consumer exist
    yield client
    await client.close()


async def test_mailroom_publishes_requests_and_reads_the_recognizers_results(mailroom, connect_as):
    settings = mailroom.settings
    recognizer = await connect_as("recognizer")
    requests = await recognizer.nc.subscribe(settings.subject(settings.tabular_subject))
    await flushed(recognizer.nc)  # the server has the subscription before the request goes out
    results = await mailroom.subscribe_results()
    try:
        job = uuid.uuid4().hex
        request = OutgoingMessage(settings.tabular_subject, job.encode(), f"req-{job}")
        await mailroom.publish(request)
        received = await requests.next_msg(timeout=5.0)
        assert received.data == job.encode()

        await recognizer.nc.publish(settings.results_subject, f"result {job}".encode())
        await flushed(recognizer.nc)
        fetched = await _fetch_until(results, f"result {job}".encode())
        assert fetched == f"result {job}".encode()
    finally:
        await results.close()
        await requests.unsubscribe()
    assert recognizer.errors.empty()


async def test_only_the_recognizer_can_publish_a_result(mailroom, connect_as):
    settings = mailroom.settings
    results = await mailroom.subscribe_results()
    intruder, recognizer = await connect_as("mailroom"), await connect_as("recognizer")
    try:
        forged = f"forged {uuid.uuid4().hex}".encode()
        await intruder.nc.publish(settings.results_subject, forged)
        assert "permissions violation for publish" in (await intruder.violation()).lower()

        # The server refused the forged result before this one: the first result to reach
        # Mailroom after it is the recognizer's.
        genuine = f"genuine {uuid.uuid4().hex}".encode()
        await recognizer.nc.publish(settings.results_subject, genuine)
        await flushed(recognizer.nc)
        seen = await _fetch_all_until(results, genuine)
        assert forged not in seen and seen[-1] == genuine
    finally:
        await results.close()


async def test_the_recognizer_cannot_publish_requests_or_touch_the_stream(connect_as):
    recognizer = await connect_as("recognizer")
    await recognizer.nc.publish("files.tabular_uploaded", b"{}")
    assert 'publish to "files.tabular_uploaded"' in (await recognizer.violation()).lower()
    await recognizer.nc.publish("$JS.API.STREAM.DELETE.MAILROOM_FILES", b"")
    assert "$js.api.stream.delete.mailroom_files" in (await recognizer.violation()).lower()


async def test_a_client_without_a_login_is_refused_in_one_line(deployed_nats):
    settings = _settings(deployed_nats, "mailroom").model_copy(
        # Mailroom would refuse a link without a login itself: allowed here, the server refuses.
        update={"user": "", "password": NatsSettings().password, "allow_anonymous": True}
    )
    client = NatsClient(settings, name="anonymous")
    with pytest.raises(NatsUnavailable, match=r"NATS refused the login \(no credentials given\)"):
        await client.connect()
    await client.close()


async def _fetch_all_until(results, wanted: bytes) -> list[bytes]:
    """Every result fetched (and acked) up to and including ``wanted``."""
    seen: list[bytes] = []
    async with asyncio.timeout(10.0):
        while wanted not in seen:
            for message in await results.fetch(10, 1.0):
                seen.append(message.data)
                await message.ack()
    return seen


async def _fetch_until(results, wanted: bytes) -> bytes:
    return (await _fetch_all_until(results, wanted))[-1]


async def test_the_recognizers_answers_are_acknowledged_by_the_stream(mailroom, deployed_nats):
    from mailroom.recognizer.connect import INBOX_PREFIX
    from mailroom.service import AnswerPublisher

    errors: asyncio.Queue[Exception] = asyncio.Queue()

    async def on_error(exc: Exception) -> None:
        errors.put_nowait(exc)

    settings = _settings(deployed_nats, "recognizer")
    nc = await nats.connect(
        settings.url,
        error_cb=on_error,
        allow_reconnect=False,
        inbox_prefix=INBOX_PREFIX,
        **connect_options(settings),
    )
    try:
        answers = AnswerPublisher(nc, settings.results_subject, timeout_s=2.0)
        await answers.publish(b"{}", f"{uuid.uuid4()}:1:ack")
        assert answers.captured
        assert errors.empty()
    finally:
        await nc.close()


async def test_nats_setup_makes_the_stream_and_consumer_with_the_administrators_login(
    deployed_nats, monkeypatch
):
    from typer.testing import CliRunner

    from mailroom.cli import app

    for name, value in {
        "URL": deployed_nats.url_for(),
        "USER": "mailroom-admin",
        "PASSWORD": PASSWORDS["mailroom-admin"],
    }.items():
        monkeypatch.setenv(f"MAILROOM_NATS__{name}", value)
    result = await asyncio.to_thread(CliRunner().invoke, app, ["nats", "setup"])

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(
        "stream MAILROOM_FILES: files.tabular_uploaded, files.img_uploaded, files.tabular_parsed"
    )
    assert lines[1].startswith("consumer mailroom-inbox of MAILROOM_FILES: ")
    assert "durable pull on files.tabular_parsed" in lines[1]
    # Run again, it changes nothing and says so.
    assert (await _set_up(deployed_nats))[1].startswith(
        "consumer mailroom-inbox of MAILROOM_FILES: exists"
    )


async def test_nats_setup_with_the_runtime_login_fails_in_one_line(deployed_nats, monkeypatch):
    from typer.testing import CliRunner

    from mailroom.cli import app

    for name, value in {
        "URL": deployed_nats.url_for(),
        "USER": "mailroom",
        "PASSWORD": PASSWORDS["mailroom"],
        # A stream of a name the runtime user may not even look up: setup has to create it.
        "STREAM_NAME": "NOT_SET_UP",
        "PUBLISH_TIMEOUT_S": "1",
    }.items():
        monkeypatch.setenv(f"MAILROOM_NATS__{name}", value)
    result = await asyncio.to_thread(CliRunner().invoke, app, ["nats", "setup"])

    assert result.exit_code == 1, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("mailroom:")]
    assert line.startswith("mailroom: nats setup: stream NOT_SET_UP: timed out: NATS did not")
    assert "nats.user is 'mailroom'" in line and "mailroom-admin" in line


async def test_the_runtime_user_reads_its_consumers_state(mailroom):
    assert await mailroom.inbox_backlog() is not None  # CONSUMER.INFO, for the gate


#: JetStream calls that change the stream or its consumers, each refused to the runtime user.
CHANGES = [
    "$JS.API.STREAM.UPDATE.MAILROOM_FILES",
    "$JS.API.STREAM.DELETE.MAILROOM_FILES",
    "$JS.API.STREAM.PURGE.MAILROOM_FILES",
    "$JS.API.STREAM.CREATE.SHADOW",
    "$JS.API.CONSUMER.CREATE.MAILROOM_FILES.spy",
    "$JS.API.CONSUMER.DURABLE.CREATE.MAILROOM_FILES.spy",
    "$JS.API.CONSUMER.DELETE.MAILROOM_FILES.mailroom-inbox",
]


@pytest.mark.parametrize("subject", CHANGES)
async def test_the_runtime_user_cannot_change_the_stream_or_its_consumers(
    mailroom, connect_as, subject
):
    runtime = await connect_as("mailroom")
    await runtime.nc.publish(subject, b"{}")
    assert f'publish to "{subject.lower()}"' in (await runtime.violation()).lower()


async def test_a_subject_transform_cannot_turn_mailrooms_requests_into_results(
    mailroom, connect_as
):
    """The runtime user reads the stream's config, adds a transform that would store requests
    as results, then publishes a result-shaped request: the server refuses the change, and the
    inbox's consumer sees only the recognizer's result."""
    settings = mailroom.settings
    intruder, recognizer = await connect_as("mailroom"), await connect_as("recognizer")
    stream = f"$JS.API.STREAM.INFO.{settings.stream_name}"
    config = json.loads((await intruder.nc.request(stream, b"", timeout=5.0)).data)["config"]
    config["subject_transform"] = {"src": "files.img_uploaded", "dest": "files.tabular_parsed"}

    update = f"$JS.API.STREAM.UPDATE.{settings.stream_name}"
    with pytest.raises(nats.errors.TimeoutError):
        reply = await intruder.nc.request(update, json.dumps(config).encode(), timeout=2.0)
        pytest.fail(f"the stream took the runtime user's change: {reply.data[:200]!r}")
    assert "permissions violation for publish" in (await intruder.violation()).lower()
    after = json.loads((await intruder.nc.request(stream, b"", timeout=5.0)).data)["config"]
    assert "subject_transform" not in after

    results = await mailroom.subscribe_results()
    try:
        job = uuid.uuid4()
        forged = json.dumps({"job_id": str(job), "file_id": 1, "status": "error"}).encode()
        request = OutgoingMessage(settings.image_subject, forged, f"{job}:1:result")
        await mailroom.publish(request)  # a request subject: allowed, and stored as a request
        genuine = f"genuine {uuid.uuid4().hex}".encode()
        await recognizer.nc.publish(settings.results_subject, genuine)
        await flushed(recognizer.nc)
        seen = await _fetch_all_until(results, genuine)
        assert forged not in seen
    finally:
        await results.close()
