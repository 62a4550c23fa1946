"""The "Needs a person" page in a real browser: an action is done only once it is confirmed."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import OPERATOR
from tests.browser.console import Console

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(420)]


def test_an_operator_unblocks_a_mailbox_only_once_they_confirm(
    console_system: Console, operator_page: Page
):
    console, page = console_system, operator_page
    # Given a mailbox blocked at the mail that took its worker down (as intake leaves it;
    # not one of the system's mailboxes, so no poll of the other tests meets it)
    name = f"held-{uuid.uuid4().hex[:6]}"
    console.system.query(
        "INSERT INTO mailbox_cursor (mailbox, folder, status, blocked_uid, retry_count, last_error)"
        " VALUES (%s, 'INBOX', 'blocked', 7, 3, 'ClaimsExhausted: the worker died') RETURNING id",
        name,
    )

    def status() -> str:
        found: str = console.system.scalar(
            "SELECT status FROM mailbox_cursor WHERE mailbox = %s", name
        )
        return found

    page.goto(f"{console.url}/attention")
    row = page.locator("tr", has_text=name)
    expect(row).to_contain_text("UID 7")

    # When the operator asks to unblock it and goes back at the confirmation, nothing is done
    row.get_by_role("button", name="Unblock").click()
    expect(page.locator("main")).to_contain_text(f"Let mailbox {name} (INBOX) be polled again")
    page.get_by_role("link", name="No, go back").click()
    expect(page.locator("tr", has_text=name)).to_be_visible()
    assert status() == "blocked"

    # When they ask again and confirm
    page.locator("tr", has_text=name).get_by_role("button", name="Unblock").click()
    page.locator("#confirm-button").click()

    # Then the page says what was done, the row is gone and the change is the operator's
    expect(page.locator(".notice")).to_contain_text(f"unblocked {name}/INBOX")
    expect(page.locator("tr", has_text=name)).to_have_count(0)
    assert status() == "idle"
    audited = console.system.query(
        "SELECT actor_id, detail ->> 'blocked_uid' FROM audit_event"
        " WHERE action = 'intake.unblocked' AND target = %s",
        f"mailbox:{name}/INBOX",
    )
    assert audited == [(OPERATOR, "7")]
