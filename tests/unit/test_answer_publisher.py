"""How the service kit publishes an answer when JetStream cannot say whether a stream captures
the answers subject (no leader yet, a busy server): never with core NATS, where it could be lost
without an error, but through JetStream, whose acknowledgement says it was kept."""

from __future__ import annotations

from typing import Any

import nats.errors
import nats.js.errors
import pytest

from mailroom.service import AnswerPublisher


class _JetStream:
    def __init__(self, lookup_error: Exception | None) -> None:
        self.lookup_error = lookup_error
        self.published: list[str] = []

    async def find_stream_name_by_subject(self, subject: str) -> str:
        if self.lookup_error is not None:
            raise self.lookup_error
        return "ANSWERS"

    async def publish(self, subject: str, data: bytes, **_: Any) -> None:
        self.published.append(subject)


class _Connection:
    def __init__(self, js: _JetStream) -> None:
        self.js = js
        self.core: list[str] = []

    def jetstream(self, **_: Any) -> _JetStream:
        return self.js

    async def publish(self, subject: str, data: bytes, **_: Any) -> None:
        self.core.append(subject)

    async def flush(self, timeout: float = 10.0) -> None:
        return None


@pytest.mark.parametrize(
    "lookup_error",
    [nats.js.errors.ServiceUnavailableError(), nats.errors.TimeoutError()],
    ids=["no-leader", "timeout"],
)
async def test_an_answer_goes_through_jetstream_when_the_lookup_cannot_tell(lookup_error):
    connection = _Connection(_JetStream(lookup_error))
    publisher = AnswerPublisher(connection, "answers", timeout_s=1.0)  # type: ignore[arg-type]
    await publisher.publish(b"{}", "job:1:ack")
    assert (connection.js.published, connection.core) == (["answers"], [])
    assert not publisher.captured  # asked again for the next answer


async def test_an_answer_goes_out_with_core_nats_when_no_stream_captures_the_subject():
    connection = _Connection(_JetStream(nats.js.errors.NotFoundError()))
    publisher = AnswerPublisher(connection, "answers", timeout_s=1.0)  # type: ignore[arg-type]
    await publisher.publish(b"{}", "job:1:ack")
    assert (connection.js.published, connection.core) == ([], ["answers"])
