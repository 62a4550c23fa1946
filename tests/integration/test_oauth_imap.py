"""OAuth 2.0 IMAP login against pymap (XOAUTH2, OAUTHBEARER) and a local token endpoint:
fresh, cached, refreshed and refused tokens, and what intake records when the token is refused;
Dovecot's oauth2 passdb takes the same tokens."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mailroom.adapters import oauth
from mailroom.adapters.imap import ImapMailbox
from mailroom.devtools.imap import demo_mailbox
from mailroom.errors import MailboxLoginRejected, OAuthTokenRefused, OAuthTokenUnavailable
from mailroom.intake.operations import unblock_mailbox
from mailroom.settings import MailboxSettings
from tests.fixtures.imap import csv_mail, new_folder
from tests.fixtures.oauth import OAuthImapServer, TokenEndpoint, TokenReply

pytestmark = pytest.mark.integration


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The process's token cache, replaced by one on a clock the test moves."""
    fake = FakeClock()
    monkeypatch.setattr(oauth, "TOKENS", oauth.TokenProvider(clock=fake))
    return fake


@pytest.fixture
def mail_server(oauth_imap_server: OAuthImapServer) -> OAuthImapServer:
    """intake_env reads from the OAuth-capable pymap."""
    return oauth_imap_server


def oauth_mailbox(
    server: OAuthImapServer, folder: str, endpoint: TokenEndpoint, **overrides: Any
) -> MailboxSettings:
    values = demo_mailbox("box", server.host, server.port)
    del values["password"]
    values.update(folder=folder, idle=False, timeout_s=10.0, auth="xoauth2")
    return MailboxSettings(**{**values, "oauth": endpoint.oauth(), **overrides})


async def read_uids(settings: MailboxSettings) -> list[int]:
    mailbox = ImapMailbox(settings)
    try:
        await mailbox.connect()
        await mailbox.select(settings.folder)
        return await mailbox.uids_above(0)
    finally:
        await mailbox.close()


@pytest.mark.parametrize("auth", ["xoauth2", "oauthbearer"])
async def test_token_login_reads_the_folder(oauth_imap_server, token_endpoint, clock, auth):
    folder = new_folder(oauth_imap_server)
    uids = oauth_imap_server.append(folder, csv_mail(1))

    settings = oauth_mailbox(oauth_imap_server, folder, token_endpoint, auth=auth)
    assert await read_uids(settings) == uids

    (request,) = token_endpoint.requests
    assert request == {"grant_type": "refresh_token", "client_id": "mailroom-test"}


async def test_token_is_cached_then_refreshed_after_expiry(
    oauth_imap_server, token_endpoint, clock
):
    folder = new_folder(oauth_imap_server)
    settings = oauth_mailbox(oauth_imap_server, folder, token_endpoint)

    # Two connections log in at once, each from its own thread: one request between them.
    await asyncio.gather(read_uids(settings), read_uids(settings))
    await read_uids(settings)
    assert len(token_endpoint.requests) == 1, "three logins, one token"

    clock.now += 3600 - 60 + 1  # expires_in 3600, renewed 60 s before
    await read_uids(settings)
    assert len(token_endpoint.requests) == 2


async def test_refused_token_is_a_clear_login_error_and_is_not_reused(
    oauth_imap_server, token_endpoint, clock
):
    folder = new_folder(oauth_imap_server)
    settings = oauth_mailbox(oauth_imap_server, folder, token_endpoint)
    token_endpoint.valid = False  # the server will not take what the endpoint issues

    with pytest.raises(MailboxLoginRejected, match="XOAUTH2 token refused"):
        await read_uids(settings)

    token_endpoint.valid = True
    assert await read_uids(settings) == []
    assert len(token_endpoint.requests) == 2, "the refused token was dropped from the cache"


async def test_token_endpoint_refusal_and_outage(oauth_imap_server, token_endpoint, clock):
    folder = new_folder(oauth_imap_server)
    settings = oauth_mailbox(oauth_imap_server, folder, token_endpoint)
    token_endpoint.script.append(
        TokenReply(400, {"error": "invalid_grant", "error_description": "refresh token expired"})
    )
    token_endpoint.script.append(TokenReply(503))

    with pytest.raises(OAuthTokenRefused, match="invalid_grant: refresh token expired") as refused:
        await read_uids(settings)
    assert "refresh-1" not in str(refused.value) and "client-secret" not in str(refused.value)
    with pytest.raises(OAuthTokenUnavailable, match="HTTP 503"):
        await read_uids(settings)


async def test_intake_records_a_refused_grant_backs_off_and_recovers(
    intake_env, token_endpoint, clock
):
    intake_env.settings.intake.mailboxes[0] = oauth_mailbox(
        intake_env.server, intake_env.folder, token_endpoint
    )
    (uid,) = intake_env.append(csv_mail(1))
    token_endpoint.script.append(TokenReply(400, {"error": "invalid_grant"}))

    outcome = await intake_env.poll()

    assert outcome.status == "batch_failed"
    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.retry_count) == ("failed", 1)
    assert cursor.last_error.startswith("OAuthTokenRefused")
    assert "invalid_grant" in cursor.last_error
    assert (await intake_env.poll()).reason == "backoff"

    intake_env.clock.advance(3)
    assert (await intake_env.poll()).status == "done"
    assert [m.uid for m in await intake_env.mails()] == [uid]


async def test_a_grant_refused_every_time_blocks_the_mailbox_until_an_operator_unblocks_it(
    intake_env, token_endpoint, clock
):
    intake_env.settings.intake.mailboxes[0] = oauth_mailbox(
        intake_env.server, intake_env.folder, token_endpoint
    )
    intake_env.settings.intake.block_after_refusals = 2
    (uid,) = intake_env.append(csv_mail(1))
    token_endpoint.script.extend([TokenReply(400, {"error": "invalid_grant"})] * 2)

    assert (await intake_env.poll()).status == "batch_failed"
    intake_env.clock.advance(3)
    outcome = await intake_env.poll()

    assert outcome.status == "blocked"
    cursor = await intake_env.cursor()
    assert (cursor.status, cursor.retry_count, cursor.next_retry_at) == ("blocked", 2, None)
    assert cursor.last_error.startswith("OAuthTokenRefused")
    assert cursor.blocked_reason == "LOGIN_REFUSED"
    (event,) = await intake_env.audit("intake.cursor_blocked")
    assert event.detail["retry_count"] == 2 and "invalid_grant" in event.detail["error"]
    intake_env.clock.advance(3600)
    assert (await intake_env.poll()).status == "skipped", "blocked until an operator acts"

    await unblock_mailbox(intake_env.sessions, "box")
    assert (await intake_env.poll()).status == "done"
    assert [m.uid for m in await intake_env.mails()] == [uid]


async def test_dovecot_oauth2_passdb_takes_a_fresh_token_and_refuses_another(
    oauth_dovecot, token_endpoint, clock
):
    folder = new_folder(oauth_dovecot)
    uids = oauth_dovecot.append(folder, csv_mail(1))
    for auth in ("xoauth2", "oauthbearer"):
        settings = oauth_mailbox(oauth_dovecot, folder, token_endpoint, auth=auth)
        assert await read_uids(settings) == uids, auth

    # Refused last: Dovecot delays the next login from the address after a failure.
    clock.now += 3600  # the next login fetches a token the server will not take
    token_endpoint.valid = False
    with pytest.raises(MailboxLoginRejected, match="OAUTHBEARER token refused"):
        await read_uids(settings)
