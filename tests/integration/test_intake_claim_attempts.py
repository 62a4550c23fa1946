"""Intake counts its attempts at a UID before parsing: a mail that kills its worker still ends.

A killed worker records nothing and gives nothing back, so these tests leave what
it leaves: a poll that stops while parsing the killing mail (``WorkerDied``, with
the give-back switched off as a dead process runs none), its attempt counted and
its lease held; the lease then runs out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

from mailroom.adapters.imap import FetchedMail, ImapMailbox
from mailroom.intake import cursor as cursors
from mailroom.intake import ingest
from mailroom.intake.audit import CURSOR_BLOCKED
from mailroom.intake.operations import unblock_mailbox
from tests.fixtures.imap import csv_mail, make_mail

pytestmark = pytest.mark.integration

KILLER = b"KILLER"


class WorkerDied(BaseException):
    """Stands for the worker's death: nothing after it runs."""


def _killer() -> bytes:
    return make_mail(99, subject=KILLER.decode(), message_id="<killer@example.com>")


async def die_in_parsing(env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll whose worker dies as it parses the killing mail; its lease then expires."""
    parse = ingest.parse_mail

    def parse_or_die(raw: bytes, *args: Any, **kwargs: Any) -> Any:
        if KILLER in raw:
            raise WorkerDied
        return parse(raw, *args, **kwargs)

    async def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    with monkeypatch.context() as patch:
        patch.setattr(ingest, "parse_mail", parse_or_die)
        patch.setattr(cursors, "give_back_attempt", nothing)
        with pytest.raises(WorkerDied):
            await env.poll()
    env.clock.advance(env.settings.intake.lease_s + 1)


def few_retries(env) -> int:
    """A small maximum keeps the tests short; the rules do not depend on it."""
    env.settings.intake.max_retries = 2
    return 2


async def stored_uids(env) -> list[int]:
    return [m.uid for m in await env.mails() if m.status == "stored"]


async def test_deaths_on_the_first_new_mail_block_the_cursor_at_its_uid(intake_env, monkeypatch):
    good = intake_env.append(csv_mail(1))[0]
    assert (await intake_env.poll()).status == "done"
    killer, after = intake_env.append(_killer(), csv_mail(2))
    max_retries = few_retries(intake_env)

    # The first death is a group's: it blames no mail, and the next poll goes mail by mail.
    await die_in_parsing(intake_env, monkeypatch)
    cursor = await intake_env.cursor()
    assert (cursor.attempt_uid, cursor.attempt_count) == (good, 1)
    for deaths in range(1, max_retries + 1):
        await die_in_parsing(intake_env, monkeypatch)
        cursor = await intake_env.cursor()
        assert (cursor.attempt_uid, cursor.attempt_count) == (killer, deaths)
    outcome = await intake_env.poll()

    assert outcome.status == "blocked"
    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.blocked_uid, cursor.last_uid) == ("blocked", killer, good)
    assert "ClaimsExhausted" in cursor.last_error
    (event,) = await intake_env.audit(CURSOR_BLOCKED)
    assert event.detail["uid"] == killer
    assert [(m.uid, m.status) for m in await intake_env.mails()] == [
        (good, "stored"),
        (killer, "failed"),
    ], "the killing mail is not read again, and nothing behind it is stored"
    intake_env.clock.advance(3600)
    assert (await intake_env.poll()).reason == "blocked"
    assert len(await intake_env.audit(CURSOR_BLOCKED)) == 1

    # The operator unblocks: the count starts over, so the mail gets its attempts again.
    await unblock_mailbox(intake_env.sessions, "box")
    assert (await intake_env.poll()).status == "done"
    assert await stored_uids(intake_env) == [good, killer, after]


async def test_a_poison_behind_innocent_mails_blocks_at_its_own_uid(intake_env, monkeypatch):
    first = intake_env.append(csv_mail(1))[0]
    assert (await intake_env.poll()).status == "done"
    second, third, killer, after = intake_env.append(
        csv_mail(2), csv_mail(3), _killer(), csv_mail(4)
    )
    max_retries = few_retries(intake_env)

    # The group holding the killer dies before any of it commits.
    await die_in_parsing(intake_env, monkeypatch)
    assert await stored_uids(intake_env) == [first]
    # Mail by mail: the innocent mails before it are stored, the count stays at the killer.
    await die_in_parsing(intake_env, monkeypatch)
    assert await stored_uids(intake_env) == [first, second, third]
    cursor = await intake_env.cursor()
    assert (cursor.last_uid, cursor.attempt_uid, cursor.attempt_count) == (third, killer, 1)
    for _ in range(max_retries - 1):
        await die_in_parsing(intake_env, monkeypatch)

    assert (await intake_env.poll()).status == "blocked"

    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.blocked_uid, cursor.last_uid) == ("blocked", killer, third)
    (event,) = await intake_env.audit(CURSOR_BLOCKED)
    assert event.detail["uid"] == killer
    assert [(m.uid, m.status) for m in await intake_env.mails()] == [
        (first, "stored"),
        (second, "stored"),
        (third, "stored"),
        (killer, "failed"),
    ]
    assert after > killer


async def test_fewer_deaths_than_the_maximum_still_read_the_mail_and_progress_resets(
    intake_env, monkeypatch
):
    killer, after = intake_env.append(_killer(), csv_mail(2))
    for _ in range(few_retries(intake_env)):  # one group's death, then solo ones
        await die_in_parsing(intake_env, monkeypatch)

    assert (await intake_env.poll()).status == "done"

    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.last_uid, cursor.attempt_count) == ("idle", after, 0)
    assert await stored_uids(intake_env) == [killer, after]


class SlowLogin(ImapMailbox):
    """The real adapter, with a server that takes its time to log in."""

    async def connect(self) -> None:
        await asyncio.sleep(30)


async def test_a_claim_and_a_poll_before_its_mail_count_no_attempt(intake_env):
    """A death before a poll found its mail charges nothing: its mailbox never blocks for it."""
    intake_env.append(csv_mail(1))
    claim = await cursors.claim_cursor(
        intake_env.sessions,
        mailbox="box",
        folder=intake_env.folder,
        lease_s=intake_env.settings.intake.lease_s,
        clock=intake_env.clock,
    )
    assert isinstance(claim, cursors.Claim)
    assert (await intake_env.cursor()).attempt_count == 0

    poll = asyncio.create_task(intake_env.poll(connect=SlowLogin))
    intake_env.clock.advance(intake_env.settings.intake.lease_s + 1)  # the first claim died
    for _ in range(200):  # until the poll's claim is committed; it then waits for its login
        await asyncio.sleep(0.05)
        async with intake_env.sessions() as session:
            lease = await session.scalar(text("SELECT lease_id FROM mailbox_cursor"))
        if lease is not None and lease != claim.lease_id:
            break
    await asyncio.sleep(0.5)
    assert (await intake_env.cursor()).attempt_count == 0, "a claim counts nothing"
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll
    assert (await intake_env.cursor()).attempt_count == 0


class FetchFails(ImapMailbox):
    async def fetch(self, uids: list[int]) -> list[FetchedMail]:
        raise ConnectionResetError("connection reset mid-fetch")


class Down(ImapMailbox):
    async def connect(self) -> None:
        raise ConnectionRefusedError("imap down")


async def test_a_failed_batch_gives_back_its_own_attempt_only(intake_env, monkeypatch):
    killer = intake_env.append(_killer())[0]
    for _ in range(2):  # a group's death, then one at the killer
        await die_in_parsing(intake_env, monkeypatch)
    cursor = await intake_env.cursor()
    assert (cursor.attempt_uid, cursor.attempt_count) == (killer, 1)

    # Down before it counted: the dead worker's attempt stays.
    assert (await intake_env.poll(connect=Down)).status == "batch_failed"
    cursor = await intake_env.cursor()
    assert (cursor.attempt_uid, cursor.attempt_count) == (killer, 1)

    # Failed after it counted (mail by mail, at the killer): its own attempt goes back.
    intake_env.clock.advance(intake_env.settings.intake.max_backoff_s + 1)
    assert (await intake_env.poll(connect=FetchFails)).status == "batch_failed"
    cursor = await intake_env.cursor()
    assert (cursor.attempt_uid, cursor.attempt_count) == (killer, 1)


async def test_a_cancelled_poll_gives_its_attempt_back(intake_env, monkeypatch):
    killer = intake_env.append(_killer())[0]
    await die_in_parsing(intake_env, monkeypatch)  # the next poll goes mail by mail
    reading = asyncio.Event()
    release = asyncio.Event()

    class SlowFetch(ImapMailbox):
        async def fetch(self, uids: list[int]) -> list[FetchedMail]:
            reading.set()
            await release.wait()
            return await super().fetch(uids)

    poll = asyncio.create_task(intake_env.poll(connect=SlowFetch))
    await asyncio.wait_for(reading.wait(), 10)
    cursor = await intake_env.cursor()
    assert (cursor.attempt_uid, cursor.attempt_count) == (killer, 1), "counted before reading"
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll

    assert (await intake_env.cursor()).attempt_count == 0
