"""Intake counts its claims at a UID before the batch: a mail that kills its worker still ends.

A killed worker records nothing, so these tests leave what it leaves: a claim
(counted, leased) and no outcome; the lease then runs out.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from mailroom.intake import cursor as cursors
from mailroom.intake.audit import CURSOR_BLOCKED
from mailroom.intake.operations import unblock_mailbox
from tests.fixtures.imap import csv_mail, make_mail

pytestmark = pytest.mark.integration


async def die_after_claim(env) -> None:
    """A worker claims the cursor and dies before any outcome; its lease expires."""
    claim = await cursors.claim_cursor(
        env.sessions,
        mailbox="box",
        folder=env.folder,
        lease_s=env.settings.intake.lease_s,
        clock=env.clock,
    )
    assert isinstance(claim, cursors.Claim)
    env.clock.advance(env.settings.intake.lease_s + 1)


def _killer() -> bytes:
    return make_mail(99, subject="KILLER", message_id="<killer@example.com>")


async def test_claims_that_never_end_block_the_cursor_at_the_first_new_uid(intake_env):
    good = intake_env.append(csv_mail(1))[0]
    assert (await intake_env.poll()).status == "done"
    killer, after = intake_env.append(_killer(), csv_mail(2))
    max_retries = intake_env.settings.intake.max_retries

    for _ in range(max_retries):
        await die_after_claim(intake_env)
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
    assert [m.uid for m in await intake_env.mails() if m.status == "stored"] == [
        good,
        killer,
        after,
    ]


async def test_fewer_deaths_than_the_maximum_still_read_the_mail_and_progress_resets(intake_env):
    first, second = intake_env.append(csv_mail(1), csv_mail(2))
    for _ in range(intake_env.settings.intake.max_retries - 1):
        await die_after_claim(intake_env)

    assert (await intake_env.poll()).status == "done"

    cursor = await intake_env.cursor()
    assert (cursor.last_uid, cursor.attempt_count) == (second, 0)
    # A new death after progress counts from one again, at the new UID.
    await die_after_claim(intake_env)
    cursor = await intake_env.cursor()
    assert (cursor.attempt_uid, cursor.attempt_count) == (second, 1)
    assert first < second


async def test_a_recorded_failure_clears_the_claim_count(intake_env):
    intake_env.append(csv_mail(1))
    for _ in range(2):
        await die_after_claim(intake_env)

    class Down:
        def __init__(self, mailbox):
            pass

        async def connect(self):
            raise ConnectionRefusedError("imap down")

        async def close(self):
            pass

    assert (await intake_env.poll(connect=Down)).status == "batch_failed"
    assert (await intake_env.cursor()).attempt_count == 0


async def test_a_cancelled_poll_gives_its_claim_back(intake_env, imap_server):
    intake_env.settings.intake.mailboxes[0].idle = True
    intake_env.settings.intake.mailboxes[0].idle_timeout_s = 30

    poll = asyncio.create_task(intake_env.poll())
    for _ in range(200):  # until the claim is committed; the empty folder then waits in IDLE
        await asyncio.sleep(0.05)
        async with intake_env.sessions() as session:
            status = await session.scalar(text("SELECT status FROM mailbox_cursor"))
        if status == "processing":
            break
    await asyncio.sleep(0.5)
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll

    assert (await intake_env.cursor()).attempt_count == 0
