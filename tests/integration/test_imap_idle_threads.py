"""IDLE waits hold their mailboxes' own threads, never the loop's default executor."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from mailroom.adapters.imap import ImapMailbox

pytestmark = pytest.mark.integration


async def test_idle_waits_leave_the_default_executor_free(imap_server, imap_folder):
    # More IDLE waits than the default executor has threads (min(32, cpus + 4)).
    waits = min(32, (os.cpu_count() or 1) + 4) + 2
    boxes = [
        ImapMailbox(imap_server.mailbox_settings(f"box{i}", imap_folder, idle=True))
        for i in range(waits)
    ]
    idling: list[asyncio.Task[bool]] = []
    try:
        for box in boxes:
            await box.connect()
            await box.select(imap_folder)
        idling = [asyncio.create_task(box.idle(30.0)) for box in boxes]
        await asyncio.sleep(0.5)  # every wait is inside IDLE now
        assert not any(task.done() for task in idling)

        started = time.monotonic()
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 2.0) == 42
        assert time.monotonic() - started < 1.0
    finally:
        for task in idling:
            task.cancel()
        await asyncio.gather(*idling, return_exceptions=True)
        # close() wakes each cancelled IDLE by shutting its socket and waits for its thread.
        started = time.monotonic()
        await asyncio.gather(*(box.close() for box in boxes))
        assert time.monotonic() - started < 5.0
