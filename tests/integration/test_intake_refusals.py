"""Mailboxes that need a person: a refused login, a missing folder or an unverifiable server
certificate blocks the mailbox after ``block_after_refusals`` polls, on pymap and Dovecot."""

from __future__ import annotations

import logging

import pytest
from pydantic import SecretStr

from mailroom.devtools.dovecot import DovecotServer
from mailroom.intake.audit import CURSOR_BLOCKED
from mailroom.intake.operations import unblock_mailbox
from mailroom.ops.attention import needs_operator
from mailroom.settings import SentrySettings
from tests.fixtures.imap import csv_mail, on_every_server
from tests.sentry_events import capturing_sentry

pytestmark = pytest.mark.integration

DSN = SentrySettings(dsn=SecretStr("https://public@sentry.invalid/1"))


async def _poll_until_blocked(intake_env, refusals: int) -> list[str]:
    statuses = []
    for _ in range(refusals):
        statuses.append((await intake_env.poll()).status)
        intake_env.clock.advance(intake_env.settings.intake.max_backoff_s + 1)
    return statuses


async def _needs_operator(intake_env) -> dict[str, int]:
    async with intake_env.sessions() as session:
        return await needs_operator(session)


@on_every_server
async def test_a_login_refused_n_times_blocks_the_mailbox_for_an_operator(intake_env, caplog):
    box = intake_env.settings.intake.mailboxes[0]
    right = box.password
    box.password = SecretStr("wrong")
    intake_env.settings.intake.block_after_refusals = 3
    (uid,) = intake_env.append(csv_mail(1))

    with (
        capturing_sentry(intake_env.settings.model_copy(update={"sentry": DSN})) as sentry,
        caplog.at_level(logging.INFO, logger="mailroom.intake.poll"),
    ):
        statuses = await _poll_until_blocked(intake_env, 3)
        assert (await intake_env.poll()).reason == "blocked", "no login while blocked"

    assert statuses == ["batch_failed", "batch_failed", "blocked"]
    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.blocked_reason, cursor.next_retry_at) == (
        "blocked",
        "LOGIN_REFUSED",
        None,
    )
    (event,) = await intake_env.audit(CURSOR_BLOCKED)
    assert event.detail["reason"] == "LOGIN_REFUSED" and event.detail["retry_count"] == 3
    (line,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    message = line.getMessage()
    assert box.name in message and repr(box.username) in message
    assert "password" in message and f"mailroom intake unblock {box.name}" in message
    (reported,) = sentry.events
    assert "LOGIN_REFUSED" in reported["logentry"]["formatted"]
    stopped = await _needs_operator(intake_env)
    assert (stopped["mailboxes_refused"], stopped["cursors_blocked"]) == (1, 0)

    # The operator fixes the password and unblocks: the mail waiting since is read.
    box.password = right
    await unblock_mailbox(intake_env.sessions, "box")
    assert (await intake_env.poll()).status == "done"
    assert [m.uid for m in await intake_env.mails()] == [uid]
    assert (await intake_env.cursor()).blocked_reason is None
    assert (await _needs_operator(intake_env))["mailboxes_refused"] == 0


@on_every_server
async def test_a_folder_that_no_longer_exists_blocks_the_mailbox(intake_env, caplog):
    intake_env.settings.intake.mailboxes[0].folder = "no-such-folder"
    intake_env.settings.intake.block_after_refusals = 2

    with caplog.at_level(logging.ERROR, logger="mailroom.intake.poll"):
        assert await _poll_until_blocked(intake_env, 2) == ["batch_failed", "blocked"]

    cursor = await intake_env.cursor("box")
    assert (cursor.status, cursor.blocked_reason) == ("blocked", "FOLDER_MISSING")
    (line,) = caplog.records
    assert "folder exists" in line.getMessage()
    assert (await _needs_operator(intake_env))["mailboxes_refused"] == 1


@on_every_server
async def test_a_server_certificate_that_does_not_verify_blocks_the_mailbox(
    intake_env, request, caplog
):
    # Dovecot offers STARTTLS on its port; pymap on the session's second server.
    server = intake_env.server
    if not isinstance(server, DovecotServer):
        server = request.getfixturevalue("imap_tls_server")
    box = intake_env.settings.intake.mailboxes[0]
    intake_env.settings.intake.mailboxes[0] = box.model_copy(
        update={"port": server.port, "security": "starttls", "ca_file": None}
    )
    intake_env.settings.intake.block_after_refusals = 2

    with caplog.at_level(logging.ERROR, logger="mailroom.intake.poll"):
        assert await _poll_until_blocked(intake_env, 2) == ["batch_failed", "blocked"]

    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.blocked_reason) == ("blocked", "TLS_UNVERIFIED")
    assert cursor.last_error.startswith("MailboxCertificateRejected")
    (line,) = caplog.records
    assert "certificate" in line.getMessage() and "ca_file" in line.getMessage()


async def test_an_unreachable_server_backs_off_and_never_blocks(intake_env):
    from mailroom.devtools.stack import free_port

    intake_env.settings.intake.mailboxes[0].port = free_port()  # nothing listens there
    intake_env.settings.intake.block_after_refusals = 2

    assert await _poll_until_blocked(intake_env, 3) == ["batch_failed"] * 3
    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.blocked_reason) == ("failed", None)
