"""The after-ingest action over the in-memory mailbox: what each setting does, and failures."""

from __future__ import annotations

import logging

import pytest

from mailroom.adapters.imap.memory import MemoryServer
from mailroom.intake.after_ingest import apply_after_ingest, uid_ranges
from mailroom.settings import MailboxSettings


def _mailbox(**after_ingest) -> MailboxSettings:
    return MailboxSettings(
        name="box", host="h", username="u", password="demopass", folder="in", **after_ingest
    )


async def _connected(server: MemoryServer, settings: MailboxSettings):
    box = server.factory()(settings)
    await box.connect()
    await box.select("in")
    return box


@pytest.fixture
def server() -> MemoryServer:
    server = MemoryServer()
    server.create_folder("in")
    server.create_folder("done")
    for n in range(3):
        server.append("in", f"Subject: {n}\r\n\r\nbody\r\n".encode())
    return server


@pytest.mark.parametrize(
    ("settings", "flag"),
    [({"after_ingest": "seen"}, "\\Seen"), ({"after_ingest": "flag"}, "$Mailroom")],
)
async def test_seen_and_flag_set_their_flag_on_the_uids_only(server, settings, flag):
    box = await _connected(server, _mailbox(**settings))
    await apply_after_ingest(box.settings, box, [1, 2])
    await apply_after_ingest(box.settings, box, [1, 2])
    assert [server.flags("in", uid) for uid in (1, 2, 3)] == [{flag}, {flag}, set()]


async def test_none_does_nothing(server):
    box = await _connected(server, _mailbox())
    await apply_after_ingest(box.settings, box, [1, 2, 3])
    assert sorted(server.folders["in"].messages) == [1, 2, 3]
    assert all(not server.flags("in", uid) for uid in (1, 2, 3))


async def test_move_moves_once_and_a_failed_move_is_a_warning(server, caplog):
    box = await _connected(server, _mailbox(after_ingest="move", move_to="done"))
    await apply_after_ingest(box.settings, box, [1, 2])
    await apply_after_ingest(box.settings, box, [1, 2])
    assert (sorted(server.folders["in"].messages), len(server.folders["done"].messages)) == ([3], 2)
    lost = await _connected(server, _mailbox(after_ingest="move", move_to="gone"))
    with caplog.at_level(logging.WARNING):
        await apply_after_ingest(lost.settings, lost, [3])
    assert "Mailbox box: after-ingest move of UID(s) 3 failed" in caplog.text
    assert "TRYCREATE" in caplog.text
    assert sorted(server.folders["in"].messages) == [3]


async def test_an_unexpected_error_of_the_action_is_logged_not_raised(server, caplog):
    box = await _connected(server, _mailbox(after_ingest="seen"))

    async def broken(uids, flag):
        raise RuntimeError("bug")

    box.add_flags = broken
    with caplog.at_level(logging.WARNING):
        await apply_after_ingest(box.settings, box, [1])
    (record,) = caplog.records
    assert record.exc_info is not None and "UID(s) 1" in record.getMessage()


@pytest.mark.parametrize(
    ("uids", "text"),
    [([], ""), ([7], "7"), ([3, 1, 2], "1:3"), ([1, 2, 4, 6, 7, 7], "1:2,4,6:7")],
)
def test_uid_ranges_join_runs(uids, text):
    assert uid_ranges(uids) == text
