"""Whether a service waits for JetStream's PubAck and publishes again when none comes.

While the stream is healthy a service that calls ``js.publish`` and goes on without the
PubAck looks exactly like one that waits: the difference shows only when no PubAck comes,
as in a stream leader election. So the check makes one: for one more request it turns the
stream's acknowledgements off (``no_ack``: the stream still stores every message), and a
service that waits publishes its ack again under the same ``Nats-Msg-Id`` once its own
PubAck timeout passed; one that does not goes on to its result, or stays silent. Then the
acknowledgements are turned back on and the service's next try gets its PubAck. Only a
stream the check created itself is changed: never one that Mailroom or an operator runs on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from mailroom.recognition.contract.transport_check import AnswersStream, Row

#: How often the probe looks at what the service published, in seconds.
POLL_S = 0.05
NAME = "PubAck awaited, then retried"


async def probe_pubacks(
    stream: AnswersStream | None,
    *,
    send: Callable[[], Awaitable[None]],
    answers: Callable[[], list[str | None]],
    wait_s: float,
) -> Row:
    """Send one request (``send``) while the stream sends no PubAck, and judge its answers.

    ``answers``: the msg ids of the answers seen to it so far, in order; ``wait_s``: the
    longest a service may wait for a PubAck before it publishes again.
    """
    if stream is None:
        return Row(NAME, True, "no stream captures the answers (nats.jetstream false)")
    if not stream.created:
        return Row(
            NAME,
            True,
            f"not probed: stream {stream.name} existed before the check, and the probe changes "
            "only a stream the check created (run it on a NATS of its own)",
            warned=True,
        )
    await stream.acknowledge(False)
    try:
        await send()
        ends = time.monotonic() + wait_s
        while not _decided(answers()) and time.monotonic() < ends:
            await asyncio.sleep(POLL_S)
    finally:
        await stream.acknowledge(True)
    seen = answers()
    if not seen:
        return Row(NAME, False, f"no answer to the probe's request within {wait_s:g} s")
    first = seen[0] or "an answer without Nats-Msg-Id"
    if seen.count(seen[0]) >= 2:
        return Row(NAME, True, f"{first} was published again when no PubAck came")
    after = "went on to the next answer" if len(seen) > 1 else f"was silent for {wait_s:g} s"
    return Row(
        NAME,
        False,
        f"{first} got no PubAck and the service {after}: wait for each answer's PubAck and "
        "publish it again under the same Nats-Msg-Id until it comes",
    )


def _decided(seen: list[str | None]) -> bool:
    """The first answer came again (a retry), or another answer followed it (none)."""
    return bool(seen) and (seen.count(seen[0]) >= 2 or len(set(seen)) >= 2)
