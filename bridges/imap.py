"""IMAP bridge (the watcher): news of new mail on the IMAP servers → ``poll_mailbox``.

Holds NOTIFY or IDLE connections for the enabled mailboxes with ``idle`` on, shared with
other watcher processes by lease, and sends a poll when a server announces mail
(``mailroom.watcher``). Many connections on one event loop, none on a thread. A stop
signal closes every connection and gives the leases back, so another watcher takes the
accounts over at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from functools import partial

from mailroom.adapters.redis_client import async_client
from mailroom.db.engine import create_engine, create_sessionmaker
from mailroom.process.stop_signals import handle_stop_signals
from mailroom.settings import Settings
from mailroom.watcher.service import Watcher

logger = logging.getLogger(__name__)

#: Postgres connections of the watcher: the mailbox rows' reads and the poll marks.
POOL_SIZE = 2
#: Longest a stop may take, in seconds: past it the process exits without the rest of its
#: clean-up. What it did not give back (account leases, connection slots) runs out within
#: ``intake.watch_lease_s`` by itself, and the scheduler's pass polls the folders meanwhile.
STOP_BOUND_S = 2.5


def _exit_if_still_running() -> None:
    logger.warning(
        "IMAP watcher: not stopped %.1f s after the signal; exiting now (its leases run out "
        "by themselves)",
        STOP_BOUND_S,
    )
    logging.shutdown()
    os._exit(0)


def _bound_the_stop() -> None:
    timer = threading.Timer(STOP_BOUND_S, _exit_if_still_running)
    timer.daemon = True  # a stop that ends in time exits without waiting for it
    timer.start()


async def serve(settings: Settings, send: Callable[[str], object]) -> int:
    """Watch until SIGTERM or SIGINT: close the connections, give the leases back, exit 0."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_stop(*_: object) -> None:
        loop.call_soon_threadsafe(stop.set)
        _bound_the_stop()

    handle_stop_signals(on_stop)
    database = settings.database.model_copy(update={"pool_size": POOL_SIZE})
    engine = create_engine(database)
    redis = async_client(settings.stream_redis_url, settings.stream_redis)
    try:
        watcher = Watcher(
            settings=settings,
            sessions=create_sessionmaker(engine),
            redis=redis,
            send=send,
            stop=stop,
        )
        await watcher.run()
    finally:
        await redis.aclose()
        await engine.dispose()
    return 0


def run(settings: Settings) -> int:
    """Entry point of ``mailroom bridge imap``."""
    from mailroom import queues as actor_names
    from mailroom.process.observability import start_metrics_server

    # Polls go to the intake actor by name: this process loads no actor module.
    actor_names.only_send()
    from actors.broker.transport import send, set_sending_broker

    broker = set_sending_broker(settings)
    start_metrics_server(settings)
    try:
        return asyncio.run(serve(settings, partial(send, actor_names.POLL_MAILBOX)))
    finally:
        broker.close()
