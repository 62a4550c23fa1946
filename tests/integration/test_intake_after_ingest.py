"""The after-ingest action on pymap and Dovecot: mail stays unread unless a mailbox asks for
``seen``, ``flag`` or ``move``, which run after the commit and never fail or repeat the ingest."""

from __future__ import annotations

import logging

import pytest

from tests.fixtures.imap import make_mail, new_folder, on_every_server

pytestmark = [pytest.mark.integration, on_every_server]


def _configure(env, **after_ingest) -> None:
    """Give the test's mailbox ``after_ingest`` settings (validated like any load)."""
    env.settings.intake.mailboxes[0] = env.server.mailbox_settings(
        "box", env.folder, **after_ingest
    )


def _flags(env, uids: list[int], folder: str | None = None) -> dict[int, set[str]]:
    with env.server.client() as other:
        other.select_folder(folder or env.folder, readonly=True)
        found = other.get_flags(uids)
    return {uid: {flag.decode() for flag in found.get(uid, ())} for uid in uids}


async def _poll_done(env):
    outcome = await env.poll()
    assert outcome.status == "done", outcome
    return outcome


async def test_by_default_ingested_mail_stays_unread_where_it_was(intake_env):
    uids = intake_env.append(*(make_mail(n) for n in range(2)))
    await _poll_done(intake_env)
    assert [m.uid for m in await intake_env.mails()] == uids
    assert intake_env.server.uids(intake_env.folder) == uids
    assert all("\\Seen" not in flags for flags in _flags(intake_env, uids).values())


async def test_seen_marks_ingested_mail_read(intake_env):
    _configure(intake_env, after_ingest="seen")
    uids = intake_env.append(*(make_mail(n) for n in range(2)))
    await _poll_done(intake_env)
    assert len(await intake_env.mails()) == 2
    assert all("\\Seen" in flags for flags in _flags(intake_env, uids).values())


async def test_flag_sets_the_configured_flag_and_leaves_the_mail_unread(intake_env):
    _configure(intake_env, after_ingest="flag", after_ingest_flag="\\Flagged")
    uids = intake_env.append(*(make_mail(n) for n in range(2)))
    await _poll_done(intake_env)
    for flags in _flags(intake_env, uids).values():
        assert "\\Flagged" in flags and "\\Seen" not in flags, flags


async def test_a_keyword_flag_is_set_or_refused_with_a_warning_where_the_server_keeps_none(
    intake_env, mail_server, request, caplog
):
    _configure(intake_env, after_ingest="flag")  # $Mailroom
    uids = intake_env.append(make_mail(0))
    with caplog.at_level(logging.WARNING, logger="mailroom.intake.after_ingest"):
        await _poll_done(intake_env)
    assert [m.uid for m in await intake_env.mails()] == uids
    if request.node.callspec.params["mail_server"] == "pymap":
        # pymap's PERMANENTFLAGS has no \*: the keyword would live only in our session.
        assert "keeps only" in caplog.text and f"UID(s) {uids[0]}" in caplog.text
    else:
        assert "$Mailroom" in _flags(intake_env, uids)[uids[0]]
        assert caplog.records == []


async def test_move_moves_each_mail_once_in_groups_and_later_polls_find_nothing(intake_env):
    target = new_folder(intake_env.server)
    _configure(intake_env, after_ingest="move", move_to=target)
    # Groups of 2 on chunks of 2: moves run while the next chunk is being fetched.
    intake_env.settings.intake.commit_group = 2
    intake_env.settings.intake.fetch_chunk = 2
    uids = intake_env.append(*(make_mail(n) for n in range(5)))
    await _poll_done(intake_env)
    assert [m.uid for m in await intake_env.mails()] == uids
    assert intake_env.server.uids(intake_env.folder) == []
    moved = intake_env.server.uids(target)
    assert len(moved) == 5
    assert all("\\Seen" not in flags for flags in _flags(intake_env, moved, target).values())
    assert (await intake_env.cursor()).last_uid == uids[-1]

    later = intake_env.append(make_mail(5))
    second = await _poll_done(intake_env)
    assert second.result is not None and second.result.ingested == 1
    third = await _poll_done(intake_env)
    assert third.result is not None and third.result.ingested == 0
    assert [m.uid for m in await intake_env.mails()] == [*uids, *later]
    assert len(intake_env.server.uids(target)) == 6
    assert intake_env.server.uids(intake_env.folder) == []


async def test_a_failed_action_leaves_the_mail_ingested_once_with_a_warning(intake_env, caplog):
    _configure(intake_env, after_ingest="move", move_to="no-such-folder")
    uids = intake_env.append(*(make_mail(n) for n in range(3)))
    with caplog.at_level(logging.WARNING, logger="mailroom.intake.after_ingest"):
        first = await _poll_done(intake_env)
    assert first.result is not None and first.result.ingested == 3
    (warning,) = caplog.records
    message = warning.getMessage()
    assert "Mailbox box: after-ingest move of UID(s)" in message
    assert f"{uids[0]}:{uids[-1]}" in message and "no-such-folder" in message
    cursor = await intake_env.cursor()
    assert (cursor.last_uid, cursor.status, cursor.retry_count) == (uids[-1], "idle", 0)

    again = await _poll_done(intake_env)
    assert again.result is not None and again.result.ingested == 0
    assert [m.uid for m in await intake_env.mails()] == uids
    assert intake_env.server.uids(intake_env.folder) == uids
