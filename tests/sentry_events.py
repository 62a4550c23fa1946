"""A Sentry client whose events stay in memory, for tests of what on-call would see."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import sentry_sdk
from sentry_sdk.transport import Transport

from mailroom.process.observability import init_sentry
from mailroom.settings import Settings


class CapturingTransport(Transport):
    """Keeps each event and cron check-in as the JSON Sentry would receive."""

    def __init__(self, options=None):
        super().__init__(options)
        self.events: list[dict] = []
        self.check_ins: list[dict] = []

    def capture_envelope(self, envelope):
        for item in envelope.items:
            if item.headers.get("type") == "event":
                self.events.append(json.loads(item.payload.get_bytes()))
            elif item.headers.get("type") == "check_in":
                self.check_ins.append(json.loads(item.payload.get_bytes()))


@contextmanager
def capturing_sentry(settings: Settings, *, process: str = "test") -> Iterator[CapturingTransport]:
    """Sentry initialised as a Mailroom process would be, sending to a ``CapturingTransport``."""
    transport = CapturingTransport()
    init_sentry(settings, process=process, transport=transport)
    try:
        yield transport
    finally:
        sentry_sdk.flush()
        sentry_sdk.get_client().close()
        sentry_sdk.init()  # a disabled client for the rest of the session
