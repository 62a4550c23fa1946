"""A NOTIFY watch on Dovecot keeps hearing of new mail after Dovecot renews the account's
mailbox list index log (it does so every 5 minutes or more while mail comes).

Dovecot's NOTIFY watches that log by its inode, so after a renewal it looks for changes only
every ``mailbox_idle_check_interval``; the server here has it at an hour, so only the
watch's own NOOP and its NOTIFY set anew can bring the news within the test's patience.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from mailroom.adapters.imap.watch import FolderNews, WatchConnection
from mailroom.devtools.dovecot import DovecotServer
from tests.fixtures.dovecot import running_dovecot
from tests.fixtures.imap import csv_mail, new_folder

pytestmark = pytest.mark.integration

#: Longest a test waits for one piece of news, in seconds (a loaded machine).
PATIENCE_S = 60.0
#: Log renewals the test makes until NOTIFY misses a mail (it almost always does at once).
RENEWAL_TRIES = 3
#: How long NOTIFY's renewal may take to follow news a NOOP turned up, in seconds.
AFTER_NEWS_S = 10.0


@pytest.fixture(scope="module")
def deaf_after_renewal(request: pytest.FixtureRequest) -> Iterator[DovecotServer]:
    """Dovecot that, once its NOTIFY misses a change, looks for it only an hour later."""

    def deaf(binary: Path, folder: Path) -> DovecotServer:
        return DovecotServer(binary, folder, settings={"mailbox_idle_check_interval": "1h"})

    with running_dovecot(request, "mailroom-dovecot-notify-", deaf) as server:
        yield server


@pytest.fixture
async def connection(deaf_after_renewal: DovecotServer) -> AsyncIterator[WatchConnection]:
    server = deaf_after_renewal
    connection = WatchConnection(server.mailbox_settings("box", "INBOX"))
    await connection.open()
    try:
        yield connection
    finally:
        await connection.close()


async def _next(news: AsyncIterator[FolderNews]) -> FolderNews:
    return await asyncio.wait_for(anext(news), PATIENCE_S)


async def _found_by_a_noop(connection: WatchConnection, expected: FolderNews) -> bool:
    """Listen until ``expected`` comes; whether a NOOP found it (and NOTIFY was set anew).

    News a NOOP turns up is followed at once by NOTIFY set anew, whose replies come as news
    too; news the server sent by itself is followed by nothing.
    """
    listening = connection.listen(0.2)
    try:
        while await _next(listening) != expected:
            pass
        renewals = connection.renewals
        loop = asyncio.get_running_loop()
        deadline = loop.time() + AFTER_NEWS_S
        with contextlib.suppress(TimeoutError):
            while connection.renewals == renewals:
                await asyncio.wait_for(anext(listening), deadline - loop.time())
        return connection.renewals > renewals
    finally:
        await listening.aclose()


async def test_news_missed_after_a_log_renewal_is_found_and_notify_is_set_anew(
    deaf_after_renewal, connection
):
    server = deaf_after_renewal
    first, second = new_folder(server), new_folder(server)
    known = await connection.notify([first, second])
    for attempt in range(1, RENEWAL_TRIES + 1):
        server.renew_list_index_log()
        (uid,) = server.append(first, csv_mail(attempt))  # NOTIFY no longer sees it by itself
        if await _found_by_a_noop(connection, FolderNews(first, uidnext=uid + 1)):
            break
        # Dovecot heard this mail by itself (its watch met the renewal in a state that kept
        # it hearing): renew the log again and try with another mail
    assert connection.renewals == 1, "the missed news was found by a NOOP and NOTIFY set anew"
    assert known[first] < uid + 1

    # Set anew, NOTIFY watches the new log: news comes unasked (no NOOP within the hour).
    unasked = connection.listen(3600)
    (uid,) = server.append(second, csv_mail(2))
    while (news := await _next(unasked)).folder != second:
        pass
    assert news.uidnext == uid + 1
    await unasked.aclose()
