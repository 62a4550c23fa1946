"""The console's review pages on the real Postgres: the queue, a document beside its mail and
file, and accept / correct / re-run through the core functions the CLI uses."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text

from tests.fixtures.console import csrf_of, sign_in

pytestmark = pytest.mark.integration

NEEDS_NAME = {"amount": (500, 0.99)}


@pytest.fixture
def recognition_settings(console_settings):
    """The shared session and factory fixtures use the console's settings."""
    return console_settings


def file_links(html: str) -> list[int]:
    return [int(found) for found in re.findall(r'<td><a href="/files/(\d+)', html)]


def action_form(html: str, action: str) -> dict[str, str]:
    """The hidden inputs of a document page's ``action`` form, as a browser would post them."""
    form = re.search(
        rf'<form method="post" action="/files/\d+/{action}"[^>]*>(.*?)</form>', html, re.S
    )
    assert form, f"no {action} form on the page"
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form.group(1)))


async def test_the_queue_lists_files_that_need_a_person_oldest_first_and_filters_them(
    console, review_seed
):
    first = await review_seed.document(fields=NEEDS_NAME, sender="a@fund.example")
    second = await review_seed.document(
        fields={"invoice_number": ("", 0.2)}, document_type="invoice", sender="b@shop.example"
    )
    await review_seed.document(fields={"customer_id": ("C-1", 0.99), "amount": (1, 0.99)})
    sign_in(console)

    assert file_links(console.get("/review").text) == [first.file_id, second.file_id]
    assert file_links(console.get("/review?sender=SHOP").text) == [second.file_id]
    assert file_links(console.get("/review?type=fund").text) == [first.file_id]
    assert file_links(console.get("/review?reason=missing").text) == [
        first.file_id,
        second.file_id,
    ]
    assert file_links(console.get("/review?mailbox=elsewhere").text) == []


async def test_the_document_page_shows_the_mail_the_file_as_a_table_and_the_fields(
    console, review_seed
):
    ref = await review_seed.document(
        fields=NEEDS_NAME, subject="Notice March", body="Ada invested 500.", data=b"a,b\n1,2\n"
    )
    sign_in(console)

    page = console.get(f"/files/{ref.file_id}")

    assert page.status_code == 200
    assert "Notice March" in page.text and "clerk@fund.example" in page.text
    assert "Ada invested 500." in page.text
    assert "<td>1</td><td>2</td>" in page.text
    assert "Missing: investor_name|customer_id" in page.text
    assert 'name="field.amount" value="500"' in page.text
    assert 'name="field.investor_name" value=""' in page.text
    assert "0.99" in page.text


async def test_hostile_mail_strings_render_as_text(console, review_seed):
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    ref = await review_seed.document(
        fields={"amount": (hostile, 0.99)},
        subject=hostile,
        sender="x@fund.example",
        body=hostile,
        name="<b>bold</b>.csv",
        data=hostile.encode(),
    )
    sign_in(console)

    for path in (f"/files/{ref.file_id}", "/review"):
        page = console.get(path).text
        assert "<script>alert" not in page and "<img src=x" not in page and "<b>bold" not in page
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page


async def test_accepting_moves_to_the_next_document_one_page_per_document(
    console, review_seed, recognition_factory, nudges
):
    refs = [await review_seed.document(fields=NEEDS_NAME) for _ in range(20)]
    sign_in(console, "alice")
    pages = 0
    page = console.get("/review/next")
    while page.url.path.startswith("/files/"):
        pages += 1
        page = console.post(page.url.path + "/accept", data=action_form(page.text, "accept"))

    assert pages == 20
    assert page.url.path == "/review" and "nothing left to review" in page.text
    statuses = await recognition_factory.rows(
        "SELECT status, status_reason FROM stored_file WHERE id = ANY(:ids)",
        {"ids": [r.file_id for r in refs]},
    )
    assert {(s["status"], s["status_reason"]) for s in statuses} == {
        ("RECOGNIZED", "accepted by alice")
    }
    events = await recognition_factory.rows(
        "SELECT actor_id FROM audit_event WHERE action = 'review.accepted'"
    )
    assert [e["actor_id"] for e in events] == ["alice"] * 20
    assert nudges.sent == ["notify"] * 20


async def test_a_correction_is_typed_by_the_document_type_and_refused_as_the_cli_refuses(
    console, review_seed, recognition_factory
):
    ref = await review_seed.document(fields=NEEDS_NAME)
    sign_in(console, "bob")
    page = console.get(f"/files/{ref.file_id}")
    form = action_form(page.text, "correct")

    refused = console.post(
        f"/files/{ref.file_id}/correct",
        data={**form, "document_type": "fund", "field.amount": "five hundred"},
    )
    assert refused.status_code == 409
    assert "field &#39;amount&#39; takes a number" in refused.text

    done = console.post(
        f"/files/{ref.file_id}/correct",
        data={**form, "document_type": "fund", "field.amount": "510.5", "field.customer_id": "C-9"},
    )
    assert done.status_code == 200 and "corrected by bob" in done.text
    [document] = await recognition_factory.rows(
        "SELECT fields FROM document WHERE file_id = :id ORDER BY id DESC LIMIT 1",
        {"id": ref.file_id},
    )
    assert document["fields"] == {"amount": 510.5, "customer_id": "C-9"}


async def test_rerun_queues_a_new_attempt_and_nudges_the_publisher(
    console, review_seed, recognition_factory, nudges
):
    ref = await review_seed.document(fields=NEEDS_NAME)
    sign_in(console)
    page = console.get(f"/files/{ref.file_id}")

    done = console.post(f"/files/{ref.file_id}/rerun", data=action_form(page.text, "rerun"))

    assert "attempt 2 queued by alice" in done.text
    jobs = await recognition_factory.jobs_of_file(ref.file_id)
    assert [(j["attempt"], j["status"]) for j in jobs] == [(1, "done"), (2, "queued")]
    assert nudges.sent == ["publish"]


async def test_a_second_reviewer_sees_the_conflict_in_the_page(
    console, review_seed, recognition_factory
):
    ref = await review_seed.document(fields=NEEDS_NAME)
    sign_in(console, "carol")
    stale = console.get(f"/files/{ref.file_id}").text
    async with recognition_factory.sessions() as other, other.begin():
        await other.execute(
            text("SELECT 1 FROM stored_file WHERE id = :id FOR UPDATE"), {"id": ref.file_id}
        )
        busy = console.post(f"/files/{ref.file_id}/accept", data=action_form(stale, "accept"))
    assert busy.status_code == 409
    assert "is being changed right now" in busy.text

    first = console.post(f"/files/{ref.file_id}/accept", data=action_form(stale, "accept"))
    assert first.status_code == 200
    again = console.post(f"/files/{ref.file_id}/accept", data=action_form(stale, "accept"))
    assert again.status_code == 409
    assert "was reviewed meanwhile by carol" in again.text


async def test_the_file_is_served_from_its_bucket_and_nothing_outside_the_buckets(
    console, review_seed, recognition_factory
):
    ref = await review_seed.document(fields=NEEDS_NAME, data=b"x,y\n")
    sign_in(console)

    served = console.get(f"/files/{ref.file_id}/content")
    assert served.content == b"x,y\n"
    assert served.headers["content-type"] == "application/octet-stream"
    assert served.headers["content-disposition"].startswith("attachment;")

    await recognition_factory.rows(
        "UPDATE stored_object SET bucket = 'someone-else' WHERE id = :id RETURNING id",
        {"id": ref.object_id},
    )
    assert console.get(f"/files/{ref.file_id}/content").status_code == 404


async def test_a_viewer_sees_the_document_without_actions_and_cannot_post_one(console, review_seed):
    ref = await review_seed.document(fields=NEEDS_NAME)
    token = sign_in(console, "vera", "viewer")
    page = console.get(f"/files/{ref.file_id}")
    assert page.status_code == 200 and "accept-form" not in page.text

    refused = console.post(f"/files/{ref.file_id}/accept", data={"csrf": token})
    assert refused.status_code == 403 and "vera is a viewer" in refused.text


async def test_a_post_without_the_csrf_token_is_refused(console, review_seed):
    ref = await review_seed.document(fields=NEEDS_NAME)
    sign_in(console)
    assert console.post(f"/files/{ref.file_id}/accept", data={}).status_code == 403
    page = console.get(f"/files/{ref.file_id}").text
    assert csrf_of(page)
    forged = console.post(f"/files/{ref.file_id}/accept", data={"csrf": "forged"})
    assert forged.status_code == 403 and "CSRF" in forged.text


async def test_pages_need_a_sign_in_and_carry_the_security_headers(console):
    first = console.get("/review", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/signin"
    policy = first.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert first.headers["x-content-type-options"] == "nosniff"
    assert console.post("/files/1/accept", data={}).status_code == 401
