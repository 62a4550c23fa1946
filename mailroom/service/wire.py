"""A flush that means what it says: the server has read every command sent before it."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsConnection

#: How long a flush waits for the server, in seconds, unless told.
FLUSH_TIMEOUT_S = 10.0


async def flushed(nc: NatsConnection, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
    """Return once the server answered a PING sent after every command queued on ``nc``.

    nats-py's ``flush`` writes its PING straight to the socket while SUB and PUB commands
    wait in the client's buffer for its flusher task, so the PONG can come back before the
    server has them: a subscription "confirmed" so missed the first message published after
    it (3 tries in 100 on a loaded machine), and a core publish "confirmed" so had not
    left yet. The buffer goes onto the socket first (nats-py has no public call for that).
    """
    # Without it (another client, a test double) the flush alone is all there is;
    # tests/unit/test_nats_flushed.py fails should nats-py rename it.
    flush_pending = getattr(nc, "_flush_pending", None)
    if flush_pending is not None:
        # A flusher stuck on a full socket gives up with the timeout; the flush then says why.
        await asyncio.wait_for(flush_pending(force_flush=True), timeout_s)
    await nc.flush(timeout=timeout_s)  # type: ignore[arg-type]
