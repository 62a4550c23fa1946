"""The reference recognizer as a process: serve until a stop signal, then drain."""

from __future__ import annotations

import asyncio
import logging

import nats.errors

from mailroom.errors import NatsLoginRefused, NatsUnavailable
from mailroom.process.stop_signals import handle_stop_signals
from mailroom.recognizer.faults import RecognizerFaults
from mailroom.recognizer.service import ReferenceRecognizer
from mailroom.settings import Settings

logger = logging.getLogger(__name__)

#: Exit status when the NATS server refuses the credentials (a configuration error).
EXIT_LOGIN_REFUSED = 2


def run(settings: Settings) -> int:
    """Serve until SIGTERM/SIGINT, then drain and return 0 (1 if NATS went away, 2 if it
    refused the login)."""
    from mailroom.process.observability import start_metrics_server

    try:
        faults = RecognizerFaults.from_settings(settings.recognizer)
    except ValueError as exc:
        logger.error("recognizer: %s", exc)
        return 2
    # Like the bridges: the endpoint is what a container healthcheck asks.
    start_metrics_server(settings)
    return asyncio.run(_serve(settings, faults))


async def _serve(settings: Settings, faults: RecognizerFaults) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handle_stop_signals(lambda *_: loop.call_soon_threadsafe(stop.set))
    recognizer = ReferenceRecognizer(settings, faults=faults)
    try:
        await recognizer.start()
    except NatsLoginRefused as exc:
        # A configuration error, not an outage: one line and exit 2, as the bridges do.
        logger.error("recognizer: cannot start: %s", exc)
        await recognizer.stop()
        return EXIT_LOGIN_REFUSED
    except (NatsUnavailable, OSError, TimeoutError, nats.errors.Error) as exc:
        logger.error("recognizer: cannot connect to NATS: %.300s", exc)
        await recognizer.stop()
        return 1
    stopped = asyncio.create_task(stop.wait())
    lost = asyncio.create_task(recognizer.connection_lost.wait())
    await asyncio.wait({stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
    for task in (stopped, lost):
        task.cancel()
    logger.info("recognizer: stopping")
    await recognizer.stop()
    return 1 if recognizer.connection_lost.is_set() else 0
