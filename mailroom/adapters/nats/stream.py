"""The recognition stream on a shared JetStream: created when missing, never rewritten.

An operator may create the stream (replicas, limits, subjects) before Mailroom first
connects. Mailroom then only adds the subjects the stream lacks, and refuses, in one line,
a stream whose replicas or storage differ from what the settings ask: changing them would
shrink or move the operator's data. With ``nats.manage_stream`` false it creates and
changes nothing and only checks that the stream and the inbox consumer exist: they are made
by ``set_up_stream`` (``mailroom nats setup``), an administrator's step, so Mailroom's runtime
user needs no right to change JetStream (a user who may edit the stream may also add a subject
transform that stores requests as results).
"""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig, StreamInfo

from mailroom.adapters.nats.subscriptions import inbox_consumer_config
from mailroom.adapters.nats.translate import translate_errors
from mailroom.errors import NatsConfigError
from mailroom.settings import NatsSettings

#: JetStream API error code for "stream name already in use" (with another config).
STREAM_NAME_IN_USE = 10058


async def ensure_stream(js: JetStreamContext, settings: NatsSettings, subjects: list[str]) -> None:
    """Create the stream over ``subjects`` when missing; else check it and add missing subjects.

    Raises:
        NatsConfigError: the stream's replicas or storage differ from the settings, or
            (``manage_stream`` false) the stream, a subject or the inbox consumer is missing.
    """
    name = settings.stream_name
    with translate_errors(f"stream {name}"):
        info = await stream_info_or_none(js, name)
        if info is None:
            if not settings.manage_stream:
                raise NatsConfigError(
                    f"stream {name} does not exist and nats.manage_stream is false: create it "
                    f"over {', '.join(subjects)} or set nats.manage_stream to true"
                )
            try:
                await js.add_stream(_new_config(settings, subjects))
                return
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != STREAM_NAME_IN_USE:
                    raise
            # Another process created it between the lookup and the add: check theirs.
            info = await js.stream_info(name)
        _refuse_mismatch(info.config, settings)
        missing = [s for s in subjects if not _captured(s, info.config.subjects or [])]
        if missing and not settings.manage_stream:
            raise NatsConfigError(
                f"stream {name} does not capture {', '.join(missing)} and nats.manage_stream "
                "is false: add the subjects to the stream or set nats.manage_stream to true"
            )
        if missing:
            config = info.config
            config.subjects = [*(config.subjects or []), *missing]
            await js.update_stream(config)
        if not settings.manage_stream:
            await _require_consumer(js, settings)


async def set_up_stream(
    js: JetStreamContext, settings: NatsSettings, subjects: list[str]
) -> list[str]:
    """Create or align the stream and create the inbox consumer; one line on each, as it is.

    Raises:
        NatsConfigError: as ``ensure_stream``, or the inbox consumer exists on another subject.
    """
    name, durable = settings.stream_name, settings.inbox_durable
    await ensure_stream(js, settings.model_copy(update={"manage_stream": True}), subjects)
    wanted = inbox_consumer_config(settings)
    with translate_errors(f"consumer {durable}"):
        try:
            consumer = await js.consumer_info(name, durable)
            done = "exists"
        except nats.js.errors.NotFoundError:
            consumer = await js.add_consumer(name, wanted)
            done = "created"
        stream = await js.stream_info(name)
    if consumer.config.filter_subject != wanted.filter_subject:
        raise NatsConfigError(
            f"consumer {durable} of stream {name} reads {consumer.config.filter_subject!r}, "
            f"not the results subject {wanted.filter_subject!r}: delete it and run this again"
        )
    replicas = stream.config.num_replicas or 1
    return [
        f"stream {name}: {', '.join(stream.config.subjects or [])} "
        f"({replicas} {'replica' if replicas == 1 else 'replicas'}, file storage)",
        f"consumer {durable} of {name}: {done} (durable pull on {wanted.filter_subject}, "
        "explicit ack)",
    ]


def _new_config(settings: NatsSettings, subjects: list[str]) -> StreamConfig:
    return StreamConfig(
        name=settings.stream_name,
        subjects=subjects,
        duplicate_window=float(settings.duplicate_window_s),
        max_age=settings.stream_max_age_s,
        storage=StorageType.FILE,
        num_replicas=settings.stream_replicas,
    )


async def stream_info_or_none(js: JetStreamContext, name: str) -> StreamInfo | None:
    """The stream's info, or None when it does not exist."""
    try:
        return await js.stream_info(name)
    except nats.js.errors.NotFoundError:
        return None


def _refuse_mismatch(config: StreamConfig, settings: NatsSettings) -> None:
    name = settings.stream_name
    replicas = config.num_replicas or 1
    if replicas != settings.stream_replicas:
        raise NatsConfigError(
            f"stream {name} has {replicas} replicas and nats.stream_replicas is "
            f"{settings.stream_replicas}: set nats.stream_replicas to {replicas} "
            "(Mailroom never changes an existing stream's replicas)"
        )
    if config.storage not in (None, StorageType.FILE):
        raise NatsConfigError(
            f"stream {name} keeps its messages in {StorageType(config.storage).value} storage: "
            "Mailroom needs file storage, so a server restart loses no request or result"
        )


async def _require_consumer(js: JetStreamContext, settings: NatsSettings) -> None:
    try:
        await js.consumer_info(settings.stream_name, settings.inbox_durable)
    except nats.js.errors.NotFoundError as exc:
        raise NatsConfigError(
            f"consumer {settings.inbox_durable} of stream {settings.stream_name} does not "
            "exist and nats.manage_stream is false: create it (durable, explicit ack, "
            "filtered on the results subject) or set nats.manage_stream to true"
        ) from exc


def _captured(subject: str, patterns: list[str]) -> bool:
    """Whether one of the stream's subject patterns (``*`` one token, ``>`` the rest) matches."""
    tokens = subject.split(".")
    for pattern in patterns:
        wanted = pattern.split(".")
        for index, token in enumerate(wanted):
            if token == ">":
                if len(tokens) > index:
                    return True
                break
            if index >= len(tokens) or (token != "*" and token != tokens[index]):
                break
        else:
            if len(wanted) == len(tokens):
                return True
    return False
