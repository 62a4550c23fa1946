"""What the conformance check looks at besides the answers' content: buckets and how answers travel.

The check runs on the same JetStream stream as Mailroom: it creates the stream when missing,
exactly as Mailroom's processes do (or, with ``nats.manage_stream`` false, only checks that it
exists), so a service that publishes with JetStream finds it and gets its PubAck. Its own
subscription to the answers subject is a plain one and sees every answer as it was sent, with
its reply subject: ``js.publish`` is a request, sent with the inbox its PubAck comes back to; a
core ``publish`` has none. So an answer without a reply subject on a subject a stream captures
was published with core NATS, and nothing told the service whether the stream stored it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mailroom.adapters.nats import NatsClient
from mailroom.adapters.nats.stream import stream_info_or_none
from mailroom.adapters.nats.translate import translate_errors
from mailroom.adapters.storage import ObjectStore
from mailroom.errors import AppError
from mailroom.settings import Settings


@dataclass(frozen=True)
class Answer:
    """One answer as the check's plain subscription saw it."""

    msg_id: str | None
    #: The reply subject it came with; empty for a core publish.
    reply: str


@dataclass(frozen=True)
class Row:
    name: str
    passed: bool
    detail: str
    #: Passed, as Mailroom accepts it, but the service should change it.
    warned: bool = False


class AnswersStream:
    """The stream that captures the answers subject, on the check's own connection."""

    def __init__(self, client: NatsClient, name: str, *, created: bool) -> None:
        self.client = client
        self.name = name
        #: Created by this check: a test stream, which the PubAck probe may change for a while.
        self.created = created

    async def acknowledge(self, acks: bool) -> None:
        """Whether the stream sends PubAcks (``no_ack``); it stores every message either way."""
        js = self.client.jetstream_context()
        config = (await js.stream_info(self.name)).config
        config.no_ack = not acks
        await js.update_stream(config)

    async def close(self) -> None:
        await self.client.close()


async def answers_stream(settings: Settings) -> AnswersStream | None:
    """The stream that captures the answers subject, created as Mailroom would; None without one.

    Raises:
        NatsConfigError: the stream cannot be used as the settings say (one line).
        NatsUnavailable: NATS cannot be reached.
    """
    if not settings.nats.jetstream:
        return None
    client = NatsClient(settings.nats, name="conformance-stream", ensure_stream=False)
    await client.connect()
    try:
        name = settings.nats.stream_name
        with translate_errors(f"stream {name}"):
            created = await stream_info_or_none(client.jetstream_context(), name) is None
        await client.ensure_stream()
    except BaseException:
        await client.close()
        raise
    return AnswersStream(client, name, created=created)


async def buckets_row(store: ObjectStore) -> Row:
    """Whether the buckets the check and the service use exist."""
    name = "buckets"
    try:
        missing = await store.missing_buckets()
    except AppError as exc:
        return Row(name, False, f"cannot look at the buckets: {exc}")
    if missing:
        return Row(
            name,
            False,
            f"bucket {', '.join(missing)} does not exist: `mailroom migrate` creates every "
            "bucket the settings name",
        )
    return Row(name, True, f"{', '.join(store.bucket_names())} exist")


def publishing_row(answers: Iterable[Answer], *, stream: str | None, subject: str) -> Row:
    """Whether every answer went through the stream with an id it can deduplicate on."""
    name = "answers through JetStream"
    if stream is None:
        return Row(name, True, f"no stream captures {subject} (nats.jetstream false)")
    count = 0
    without_id = 0
    for answer in answers:
        count += 1
        label = answer.msg_id or "an answer"
        if not answer.reply:
            return Row(
                name,
                False,
                f"{label} was published with core NATS into {subject}, which stream {stream} "
                "captures: use js.publish, wait for its PubAck and retry under the same "
                "Nats-Msg-Id (a core publish is lost silently while the stream elects a leader)",
            )
        # NOTE: a warning, as the inbox accepts it (the rule book, contract/rules.py).
        without_id += not answer.msg_id
    if not count:
        return Row(name, False, "no answer was seen")
    if without_id:
        return Row(
            name,
            True,
            f"{without_id} answers were published without a Nats-Msg-Id: stream {stream} "
            "cannot drop their retries as duplicates; send {job_id}:{attempt}:ack|result",
            warned=True,
        )
    return Row(name, True, f"{count} answers published with js.publish into stream {stream}")
