"""Reviewing in the console, in a real browser: a real mail's document corrected through to
its notification, and a queue of twenty reviewed one page per document."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.browser.conftest import OPERATOR, SECOND_OPERATOR
from tests.browser.console import PIPELINE_TIMEOUT_S, Console
from tests.browser.mails import QUEUE_LENGTH
from tests.browser.screenshots import Screenshots

#: The first test of a run waits for the whole system to start and the mails to go through.
pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(420)]


def _changing(page: Page, *selectors: str) -> list[Locator]:
    """What changes from run to run on a page (times, Message-IDs), for the screenshots."""
    return [page.locator(selector) for selector in selectors]


#: The queue's "waiting since" column.
QUEUE_TIMES = "table.queue td:nth-child(8)"
#: A document page's "Received" and its attempts' times.
DOCUMENT_TIMES = (
    ".source dl dd:nth-of-type(3)",
    "section.fields > table:last-of-type td:nth-child(5)",
)
#: A mail's story: its Message-ID and times, its attempts' times, its notifications' times.
STORY_TIMES = (
    "main > dl dd:nth-of-type(3)",
    "main > dl dd:nth-of-type(n+5)",
    "section.file td:nth-child(n+5):nth-child(-n+8)",
    'h2:has-text("Notifications") + table td:nth-child(n+7):nth-child(-n+8)',
)


def test_an_operator_corrects_a_missing_total_and_the_notification_carries_it(
    console_system: Console,
    waiting_files: dict[str, list[int]],
    operator_page: Page,
    screenshots: Screenshots,
):
    console, page = console_system, operator_page
    [file_id] = waiting_files["correct.test"]

    def notifications(marker: str) -> list[str]:
        """What the webhook received about this mail that says ``marker``."""
        return [
            item.body
            for item in console.system.webhook.received
            if "billing@correct.test" in item.body and marker in item.body
        ]

    # The mail is final as it came: its first notification tells of the missing total.
    console.system.wait_for(
        "the first notification",
        lambda: bool(notifications("(missing: total)")),
        PIPELINE_TIMEOUT_S,
    )

    # The queue lists the file with its reason; its page shows mail, file and fields.
    page.goto(f"{console.url}/review?sender=correct.test")
    row = page.locator("table.queue tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("missing: total")
    expect(row).to_contain_text("Invoice March")
    row.get_by_role("link", name=str(file_id)).click()
    expect(page).to_have_url(re.compile(rf"/files/{file_id}\b"))
    expect(page.locator("dd.subject")).to_have_text("Invoice March")
    expect(page.locator("table.sheet")).to_contain_text("INV-7001")
    expect(page.locator(".fields p.problem")).to_have_text("Missing: total")
    screenshots.take(page, "document", hide=_changing(page, *DOCUMENT_TIMES))

    # Correct the total in place and save: the console moves on (the queue, now empty).
    page.locator('#correct-form input[name="field.total"]').fill("1234.56")
    page.get_by_role("button", name="Save corrections").click()
    expect(page.locator(".notice")).to_contain_text(
        f"file {file_id} corrected by {OPERATOR}: RECOGNIZED"
    )
    assert console.file_status(file_id) == "RECOGNIZED"

    # The mail is final again, and a second notification goes out with the corrected value.
    corrected = "total=1234.56"
    console.system.wait_for(
        "the corrected notification", lambda: bool(notifications(corrected)), PIPELINE_TIMEOUT_S
    )
    [body] = notifications(corrected)
    assert "invoice-7001.csv: RECOGNIZED as invoice" in body
    assert "invoice_number=INV-7001" in body
    assert len(notifications("billing@correct.test")) == 2
    # The correction is audited under the operator's id.
    assert console.system.query(
        "SELECT actor_id FROM audit_event WHERE target = %s AND action LIKE %s",
        f"stored_file:{file_id}",
        "%correct%",
    ) == [(OPERATOR,)]

    # The mail's whole story, found by its sender: the operator's attempt beside the service's,
    # the corrected document, and its notifications.
    page.locator("#search").fill("billing@correct.test")
    page.locator("#search").press("Enter")
    expect(page.locator("h1")).to_contain_text("Mail ")
    attempts = page.locator("section.file table").first
    expect(attempts.locator("tr.current")).to_contain_text("manual")
    expect(attempts.locator("tr.current")).to_contain_text(OPERATOR)
    expect(page.locator("section.file")).to_contain_text("1234.56")
    notifications = page.locator('h2:has-text("Notifications") + table tbody tr')
    expect(notifications.filter(has_text="webhook/")).to_have_count(2)
    screenshots.take(page, "story", hide=_changing(page, *STORY_TIMES))


def test_twenty_documents_are_reviewed_one_page_load_each(
    console_system: Console,
    waiting_files: dict[str, list[int]],
    operator_page: Page,
    screenshots: Screenshots,
):
    console, page = console_system, operator_page
    waiting = waiting_files["queue.test"]
    page.goto(f"{console.url}/review?sender=queue.test")
    expect(page.locator("table.queue tbody tr")).to_have_count(QUEUE_LENGTH)
    screenshots.take(page, "review-queue", hide=_changing(page, QUEUE_TIMES))

    # Every page the browser loads from here on (redirects are not loads of their own).
    loads: list[str] = []
    page.on("framenavigated", lambda frame: frame == page.main_frame and loads.append(frame.url))
    reviewed = []
    page.keyboard.press("n")  # the oldest first
    for _ in range(QUEUE_LENGTH):
        expect(page).to_have_url(re.compile(r"/files/\d+"))
        reviewed.append(int(re.search(r"/files/(\d+)", page.url)[1]))
        expect(page.locator("#accept-form")).to_be_visible()
        # The keys are the page's deferred script: it runs before the load event.
        page.wait_for_load_state("load")
        page.keyboard.press("a")  # accept, and on to the next
        expect(page).not_to_have_url(re.compile(rf"/files/{reviewed[-1]}\b"))
    expect(page.locator(".notice")).to_contain_text("nothing left to review")

    assert reviewed == waiting  # each once, oldest first
    documents = [url for url in loads if "/files/" in url]
    assert len(documents) == QUEUE_LENGTH  # one page per document
    assert len(loads) == QUEUE_LENGTH + 1  # and the queue, empty, at the end
    statuses = console.system.query(
        """SELECT f.status, count(*) FROM stored_file AS f JOIN inbound_mail AS m
            ON m.id = f.mail_id WHERE m.sender LIKE %s GROUP BY 1""",
        "%@queue.test",
    )
    assert statuses == [("RECOGNIZED", QUEUE_LENGTH)]


def test_a_second_operator_on_a_reviewed_document_is_told_who_reviewed_it(
    console_system: Console,
    waiting_files: dict[str, list[int]],
    operator_page: Page,
    second_operator_page: Page,
):
    console = console_system
    [file_id] = waiting_files["conflict.test"]
    first, second = operator_page, second_operator_page
    for page in (first, second):
        page.goto(f"{console.url}/files/{file_id}")

    # The first accepts; the second, still on the page as it was, corrects a field.
    first.locator("#accept-form button").click()
    expect(first.locator(".notice")).to_contain_text(f"file {file_id} accepted by {OPERATOR}")
    second.locator('#correct-form input[name="field.total"]').fill("99.00")
    with second.expect_response(lambda answer: answer.url.endswith("/correct")) as refused:
        second.get_by_role("button", name="Save corrections").click()

    # The page says what the CLI says (409 Conflict), and nothing is overwritten.
    assert refused.value.status == 409
    expect(second.locator("main .problem").first).to_contain_text(
        f"file {file_id} was reviewed meanwhile by {OPERATOR}"
    )
    expect(second.locator("header .who")).to_have_text(f"{SECOND_OPERATOR} (operator)")
    manual = console.system.query(
        "SELECT operator_id FROM recognition_job WHERE file_id = %s AND kind = 'manual'", file_id
    )
    assert manual == [(OPERATOR,)]
    assert console.file_status(file_id) == "RECOGNIZED"


def test_a_scanned_page_is_shown_in_the_document_page(
    console_system: Console, waiting_files: dict[str, list[int]], viewer_page: Page
):
    console, page = console_system, viewer_page
    [file_id] = waiting_files["scan.test"]
    served: list[tuple[str, str]] = []
    page.on(
        "response",
        lambda answer: (
            "/content" in answer.url
            and served.append((answer.headers.get("content-type", ""), answer.url))
        ),
    )

    page.goto(f"{console.url}/files/{file_id}")
    scan = page.locator("img.preview")
    expect(scan).to_have_attribute("alt", "delivery-note.png")
    # Drawn by the browser from the console's own address, under its Content-Security-Policy.
    expect(scan).to_have_js_property("complete", True)
    assert scan.evaluate("image => [image.naturalWidth, image.naturalHeight]") == [480, 240]
    assert served == [("image/png", f"{console.url}/files/{file_id}/content")]
