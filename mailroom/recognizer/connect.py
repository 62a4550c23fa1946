"""The reference recognizer's NATS connection: bounded, one line per change, a refusal is final.

nats-py retries a connection on its own (``max_reconnect_attempts`` at
``reconnect_time_wait``) and reports each failed try to ``error_cb``. Here those
reports go to an ``OutageLog`` (once when the outage starts, once per back-off
step, once when it ends), and a refused login during the first connection ends
the attempts at once as ``NatsLoginRefused``: retrying cannot fix credentials.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client as NatsConnection

from mailroom.adapters.nats.login import (
    connect_error,
    connect_options,
    is_login_refused,
    refuse_anonymous,
    server_urls,
)
from mailroom.errors import NatsUnavailable
from mailroom.process.outage import OutageLog
from mailroom.redaction import mask_urls
from mailroom.settings import NatsSettings

logger = logging.getLogger(__name__)

#: Prefix of the recognizer's reply subjects (JetStream's publish acks and lookups), so the
#: server can let it read its own replies and no one else's (deploy/nats-server.conf).
INBOX_PREFIX = "_INBOX_RECOGNIZER"

#: Wait between reconnect attempts, in seconds, and attempts before giving up.
RECONNECT_WAIT_S = 1.0
MAX_RECONNECT_ATTEMPTS = 60


async def connect(
    settings: NatsSettings, *, name: str, on_closed: Callable[[], Awaitable[None]]
) -> NatsConnection:
    """A connection to ``settings``' servers; ``NatsLoginRefused`` or ``NatsUnavailable`` if none.

    Bounded as a whole: after a failed TLS handshake nats-py never returns.
    """
    urls = server_urls(settings)  # a malformed URL fails here in one line
    refuse_anonymous(settings)  # no login outside `mailroom dev`: NatsLoginRefused, exit 2
    servers = [mask_urls(url) for url in urls]
    outage = OutageLog(f"NATS {', '.join(servers)}", logger=logger)
    nc = NatsConnection()
    refused: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    resets_held_back = 0

    async def on_error(exc: Exception) -> None:
        nonlocal resets_held_back
        if not nc.is_connected and is_login_refused(exc) and not refused.done():
            refused.set_result(exc)
            return
        if not nc.is_connected and isinstance(exc, ConnectionResetError) and resets_held_back < 3:
            # A server refusing a login sends its -ERR and closes: the client may read a reset
            # or two first. A server that is down refuses the connection instead, so a few
            # resets while connecting are not reported as an outage: the next tries say.
            resets_held_back += 1
            return
        outage.failed(f"{type(exc).__name__}: {str(exc)[:200]}", exc=exc)

    async def on_reconnected() -> None:
        outage.recovered()

    budget_s = MAX_RECONNECT_ATTEMPTS * (RECONNECT_WAIT_S + settings.connect_timeout_s)
    connecting = asyncio.ensure_future(
        nc.connect(
            urls,
            name=name,
            inbox_prefix=INBOX_PREFIX,
            connect_timeout=settings.connect_timeout_s,  # type: ignore[arg-type]
            reconnect_time_wait=RECONNECT_WAIT_S,  # type: ignore[arg-type]
            max_reconnect_attempts=MAX_RECONNECT_ATTEMPTS,
            error_cb=on_error,
            closed_cb=on_closed,
            reconnected_cb=on_reconnected,
            **connect_options(settings),
        )
    )
    waiting: set[asyncio.Future[Any]] = {connecting, refused}
    done, _ = await asyncio.wait(waiting, timeout=budget_s, return_when=asyncio.FIRST_COMPLETED)
    if connecting in done and connecting.exception() is None:
        outage.recovered()
        return nc
    connecting.cancel()
    await asyncio.gather(connecting, return_exceptions=True)
    await nc.close()
    if refused.done():
        raise connect_error(settings, refused.result())
    if connecting in done and (failure := connecting.exception()) is not None:
        raise connect_error(settings, failure) from failure
    raise NatsUnavailable(f"connect {', '.join(servers)}: no connection in {budget_s:g} s")
