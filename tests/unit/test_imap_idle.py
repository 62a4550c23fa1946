"""IMAP IDLE waits through a server's keepalives until news or its timeout."""

from __future__ import annotations

from typing import Any

import pytest

from mailroom.adapters.imap import ImapMailbox, idle
from mailroom.settings import MailboxSettings

STILL_HERE = (b"OK", b"Still here")


class FakeImap:
    def __init__(self) -> None:
        self.untagged_responses: dict[str, list[bytes]] = {}


class FakeClient:
    """The calls ``ImapMailbox._idle`` makes, answering IDLE checks from a script."""

    def __init__(self, checks: list[list[Any]]) -> None:
        self._imap = FakeImap()
        self.checks = checks
        self.timeouts: list[float] = []
        self.done = 0

    def has_capability(self, name: str) -> bool:
        return name == "IDLE"

    def noop(self) -> tuple[bytes, list[Any]]:
        return b"NOOP completed", []

    def idle(self) -> None:
        pass

    def idle_check(self, timeout: float) -> list[Any]:
        self.timeouts.append(timeout)
        return self.checks.pop(0) if self.checks else []

    def idle_done(self) -> tuple[bytes, list[Any]]:
        self.done += 1
        return b"Idle completed", []


def idle_with(monkeypatch: pytest.MonkeyPatch, client: FakeClient, timeout_s: float) -> bool:
    monkeypatch.setattr(idle, "buffered", lambda _client: False)
    mailbox = ImapMailbox(MailboxSettings(name="box", host="imap.test", username="u", password="p"))
    mailbox._client = client  # type: ignore[assignment]
    return mailbox._idle(timeout_s)


def test_a_keepalive_does_not_end_idle_before_the_mail_it_waits_for(monkeypatch):
    # Dovecot's first "Still here" can come a second into an IDLE: the mail after it counts.
    client = FakeClient([[STILL_HERE], [STILL_HERE], [(1, b"EXISTS"), (1, b"RECENT")]])

    assert idle_with(monkeypatch, client, 30.0) is True
    assert len(client.timeouts) == 3
    assert client.timeouts == sorted(client.timeouts, reverse=True)  # one deadline, not three
    assert client.done == 1


def test_idle_after_keepalives_alone_ends_at_its_timeout_with_no_news(monkeypatch):
    client = FakeClient([[STILL_HERE]])

    assert idle_with(monkeypatch, client, 30.0) is False
    assert len(client.timeouts) == 2  # the keepalive, then the wait that timed out
    assert 0 < client.timeouts[1] <= client.timeouts[0] <= 30.0
    assert client.done == 1


def test_idle_ends_at_the_first_response_that_is_more_than_a_keepalive(monkeypatch):
    # A flag change is no new mail, but not a keepalive either: the caller looks again.
    client = FakeClient([[(3, b"FETCH", (b"FLAGS", (b"\\Seen",)))], [(4, b"EXISTS")]])

    assert idle_with(monkeypatch, client, 30.0) is False
    assert len(client.timeouts) == 1
