"""The console's defences, in a real browser: roles, CSRF tokens, and mail-derived text that
stays text."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import BrowserContext, ConsoleMessage, Dialog, Page, expect

from tests.browser.conftest import OPERATOR, VIEWER
from tests.browser.console import Console
from tests.browser.mails import HOSTILE_FILE, HOSTILE_NAME, HOSTILE_SUBJECT, HOSTILE_SUPPLIER
from tests.browser.screenshots import Screenshots

#: The first test of a run waits for the whole system to start and the mails to go through.
pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(420)]


#: The test provider's page where a person chooses who they are.
PROVIDER_PAGE = re.compile(r"^http://localhost:\d+/oauth2/authorize\?")

#: The "Needs a person" page's ages of the oldest item per stage, for the screenshot.
ATTENTION_AGES = 'h2:has-text("Oldest item per stage") + table td:nth-child(2)'


def _token(page: Page) -> str:
    """The session's CSRF token, as every form of the page carries it."""
    return page.locator('input[name="csrf"]').first.get_attribute("value") or ""


def test_a_visitor_signs_in_at_the_provider_and_comes_back_to_the_page_asked_for(
    console_system: Console, waiting_files: dict[str, list[int]], context: BrowserContext
):
    console, page = console_system, context.new_page()
    [file_id] = waiting_files["viewer.test"]
    asked_for = f"{console.url}/files/{file_id}"

    page.goto(asked_for)
    expect(page).to_have_url(PROVIDER_PAGE)
    page.locator(f'button[name="sub"][value="{OPERATOR}"]').click()
    expect(page).to_have_url(asked_for)
    expect(page.locator("header .who")).to_have_text(f"{OPERATOR} (operator)")
    assert console.system.query(
        "SELECT detail ->> 'role' FROM audit_event WHERE action = %s AND actor_id = %s",
        "console.signed_in",
        OPERATOR,
    )[-1] == ("operator",)

    # Signing out ends the session: the next page sends the visitor to the provider again.
    page.get_by_role("button", name="Sign out").click()
    page.goto(f"{console.url}/review")
    expect(page).to_have_url(PROVIDER_PAGE)


def test_a_viewer_sees_a_document_but_cannot_act_on_it(
    console_system: Console,
    waiting_files: dict[str, list[int]],
    viewer_page: Page,
    screenshots: Screenshots,
):
    console, page = console_system, viewer_page
    [file_id] = waiting_files["viewer.test"]

    page.goto(f"{console.url}/files/{file_id}")
    expect(page.locator("header .who")).to_have_text(f"{VIEWER} (viewer)")
    expect(page.locator(".fields table.fields")).to_contain_text("INV-7101")
    # No action is offered, and the accept key does nothing.
    for form in ("#accept-form", "#correct-form", "#rerun-form"):
        expect(page.locator(form)).to_have_count(0)
    page.keyboard.press("a")
    expect(page.locator("h1")).to_contain_text(f"File {file_id}")

    # A viewer who posts the action anyway, with the session's own token, is refused.
    token = _token(page)
    for action in ("accept", "rerun", "correct"):
        answer = page.request.post(
            f"{console.url}/files/{file_id}/{action}",
            form={"csrf": token, "field.total": "1.00"},
            max_redirects=0,
        )
        assert answer.status == 403, (action, answer.status)
        assert "only operators act" in answer.text()
    assert console.file_status(file_id) == "NEEDS_CHECK"

    # What needs a person, counted as `mailroom status` counts it, is there to see.
    page.goto(f"{console.url}/attention")
    waiting = page.locator("table.counts tr", has_text="files needs check")
    expect(waiting.locator("td").nth(1)).not_to_have_text("0")
    expect(waiting.get_by_role("link", name="review them")).to_be_visible()
    screenshots.take(page, "attention", hide=[page.locator(ATTENTION_AGES)])


def test_a_form_posted_without_its_csrf_token_is_refused(
    console_system: Console, waiting_files: dict[str, list[int]], operator_page: Page
):
    console, page = console_system, operator_page
    [file_id] = waiting_files["csrf.test"]
    page.goto(f"{console.url}/files/{file_id}")

    # The operator's own accept form, its token taken out: the page says why it refused.
    page.locator('#accept-form input[name="csrf"]').evaluate("input => input.remove()")
    page.locator("#accept-form button").click()
    expect(page.locator("h1")).to_have_text("403")
    expect(page.locator("p.problem")).to_contain_text("CSRF token is missing or stale")

    # A token that is not the session's is refused alike, and so is a post with none at all.
    for form in ({"csrf": "forged-" + "x" * 36}, {}):
        answer = page.request.post(
            f"{console.url}/files/{file_id}/accept", form=form, max_redirects=0
        )
        assert answer.status == 403, (form, answer.status)
    assert console.file_status(file_id) == "NEEDS_CHECK"
    # The session's own token still works: only the missing one was refused.
    page.goto(f"{console.url}/files/{file_id}")
    page.locator("#accept-form button").click()
    expect(page.locator(".notice")).to_contain_text(f"file {file_id} accepted")


def test_markup_in_a_mail_renders_as_text(
    console_system: Console, waiting_files: dict[str, list[int]], operator_page: Page
):
    console, page = console_system, operator_page
    [file_id] = waiting_files["hostile.test"]
    dialogs: list[str] = []
    refused: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    def on_console(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            refused.append(message.text)

    page.on("dialog", on_dialog)
    page.on("console", on_console)

    page.goto(f"{console.url}/review?sender=hostile.test")
    row = page.locator("table.queue tbody tr")
    expect(row).to_contain_text(HOSTILE_SUBJECT)
    expect(row).to_contain_text(HOSTILE_FILE)

    page.goto(f"{console.url}/files/{file_id}")
    expect(page.locator("dd.subject")).to_have_text(HOSTILE_SUBJECT)
    expect(page.locator("h1")).to_contain_text(HOSTILE_FILE)
    expect(page.locator("main")).to_contain_text(HOSTILE_NAME)
    expect(page.locator("table.sheet")).to_contain_text(HOSTILE_SUPPLIER)
    expect(page.locator('#correct-form input[name="field.supplier"]')).to_have_value(
        HOSTILE_SUPPLIER
    )
    # Nothing of it became markup: no image, no handler, no script in the page's body.
    assert page.locator("main img, main script, main b, [onerror], [onmouseover]").count() == 0
    page.locator("dd.subject").hover()
    assert dialogs == []
    # Not even a blocked attempt: the policy had nothing to refuse.
    assert refused == []
