"""A NOTIFY watch on Dovecot keeps hearing of new mail after Dovecot renews the account's
mailbox list index log (it does so every 5 minutes or more while mail comes).

Dovecot's NOTIFY watches that log by its inode, so after a renewal it looks for changes only
every ``mailbox_idle_check_interval``; the server here has it at an hour, so only the
watch's own NOOP and its NOTIFY set anew can bring the news within the test's patience.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from mailroom.adapters.imap.watch import FolderNews, WatchConnection
from mailroom.devtools.dovecot import DovecotServer, find_dovecot, server_folder
from tests.fixtures.dovecot import _missing
from tests.fixtures.imap import csv_mail, new_folder

pytestmark = pytest.mark.integration

#: Longest a test waits for one piece of news, in seconds (a loaded machine).
PATIENCE_S = 60.0


@pytest.fixture(scope="module")
def deaf_after_renewal(request: pytest.FixtureRequest) -> Iterator[DovecotServer]:
    """Dovecot that, once its NOTIFY misses a change, looks for it only an hour later."""
    binary = find_dovecot()
    if binary is None:
        _missing(request, "Dovecot is not installed (apt-get install dovecot-imapd)")
        return
    with server_folder("mailroom-dovecot-notify-") as folder:
        server = DovecotServer(
            binary, folder, settings={"mailbox_idle_check_interval": "1h"}
        ).start()
        try:
            yield server
        finally:
            server.stop()


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


async def test_news_missed_after_a_log_renewal_is_found_and_notify_is_set_anew(
    deaf_after_renewal, connection
):
    server = deaf_after_renewal
    first, second = new_folder(server), new_folder(server)
    known = await connection.notify([first, second])
    server.renew_list_index_log()

    (uid,) = server.append(first, csv_mail(1))  # NOTIFY no longer sees it by itself
    listening = connection.listen(0.2)
    found: list[FolderNews] = []
    while connection.renewals == 0:
        found.append(await _next(listening))
    await listening.aclose()
    assert FolderNews(first, uidnext=uid + 1) in found
    assert known[first] < uid + 1

    # Set anew, NOTIFY watches the new log: news comes unasked (no NOOP within the hour).
    unasked = connection.listen(3600)
    (uid,) = server.append(second, csv_mail(2))
    while (news := await _next(unasked)).folder != second:
        pass
    assert news.uidnext == uid + 1
    await unasked.aclose()
