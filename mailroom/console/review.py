"""The review pages: the queue, a document beside its mail and file, and the three actions.

Accept, correct and re-run call the same core functions as ``mailroom review`` and move
on to the next document of the queue (a redirect: one page per document). A second
reviewer on the same file gets the core's conflict or refusal, shown in the page.
"""

from __future__ import annotations

import logging
import zipfile
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from mailroom.console.auth import require_operator
from mailroom.console.csrf import checked_form
from mailroom.console.files import (
    disposition,
    file_object,
    media_type_of,
    preview_of,
    servable,
    table_rows,
)
from mailroom.console.mails import mail_by_id, mail_text
from mailroom.console.metrics import ACTIONS
from mailroom.console.pages import error_page, render
from mailroom.console.review_forms import (
    corrections_of,
    field_inputs,
    filter_query,
    filter_values,
    place_of,
    review_filter,
)
from mailroom.console.state import console_state
from mailroom.db.engine import transaction
from mailroom.errors import AppError, ReviewConflict, ReviewRefused
from mailroom.recognition.review import actions
from mailroom.recognition.review.queries import (
    REASONS,
    ReviewFilter,
    list_review_items,
    show_review_file,
)

logger = logging.getLogger(__name__)

#: Most files the queue page lists.
QUEUE_LIMIT = 200
#: Session key of the one-line notice the next page shows.
NOTICE = "notice"


async def queue(request: Request) -> Response:
    """Files waiting for a person, oldest first, filtered."""
    state = console_state(request)
    where = review_filter(request.query_params)
    async with state.sessions() as session:
        items = await list_review_items(session, limit=QUEUE_LIMIT + 1, where=where)
    return render(
        request,
        "queue.html",
        {
            "items": items[:QUEUE_LIMIT],
            "more": len(items) > QUEUE_LIMIT,
            "filters": filter_values(where),
            "query": filter_query(where),
            "reasons": REASONS,
            "types": sorted(state.settings.recognition.document_types),
            "notice": request.session.pop(NOTICE, None),
        },
    )


async def next_document(request: Request) -> Response:
    """The first document of the (filtered) queue, or the queue when it is empty."""
    where = review_filter(request.query_params)
    return await _to_next(request, where, None)


async def document(request: Request) -> Response:
    file_id = int(request.path_params["file_id"])
    return await _document_page(request, file_id, review_filter(request.query_params))


async def content(request: Request) -> Response:
    """The file's bytes, from its bucket through the object store."""
    state = console_state(request)
    async with state.sessions() as session:
        found = await file_object(session, int(request.path_params["file_id"]))
    if found is None or not servable(found, state.settings.storage):
        return error_page(request, 404, "no stored object for this file in the configured buckets")
    assert found.bucket is not None and found.key is not None  # servable checked both
    try:
        data = await state.store.get(found.bucket, found.key)
    except AppError as exc:
        return error_page(request, 404, f"the file's object cannot be read: {exc}")
    return Response(
        data,
        media_type=media_type_of(found),
        headers={"Content-Disposition": disposition(found), "Cache-Control": "private"},
    )


async def accept(request: Request) -> Response:
    user = require_operator(request)
    form = await checked_form(request)
    file_id = int(request.path_params["file_id"])
    state = console_state(request)

    async def act(session: Any) -> actions.ReviewOutcome:
        return await actions.accept_file(
            session, file_id, operator=user.id, settings=state.settings.recognition
        )

    return await _act(request, file_id, form, "accept", act)


async def correct(request: Request) -> Response:
    user = require_operator(request)
    form = await checked_form(request)
    file_id = int(request.path_params["file_id"])
    state = console_state(request)
    recognition = state.settings.recognition
    async with state.sessions() as session:
        shown = await show_review_file(session, file_id, settings=recognition)
    if shown is None:
        return error_page(request, 404, f"file {file_id} does not exist")
    document_now = shown.item.document
    type_now = document_now.document_type if document_now else None
    chosen = form.get("document_type")
    new_type = chosen if isinstance(chosen, str) and chosen and chosen != type_now else None
    corrections = corrections_of(form, field_inputs(document_now, type_now, recognition))

    async def act(session: Any) -> actions.ReviewOutcome:
        return await actions.correct_file(
            session,
            file_id,
            corrections,
            operator=user.id,
            settings=recognition,
            document_type=new_type,
        )

    return await _act(request, file_id, form, "correct", act)


async def rerun(request: Request) -> Response:
    user = require_operator(request)
    form = await checked_form(request)
    file_id = int(request.path_params["file_id"])

    async def act(session: Any) -> Any:
        return await actions.rerun_file(session, file_id, operator=user.id, reason="console")

    return await _act(request, file_id, form, "rerun", act)


async def _act(request: Request, file_id: int, form: Any, action: str, act: Any) -> Response:
    """Run ``act`` in one transaction; on success move on, else show why on the same page."""
    state = console_state(request)
    where = review_filter(form)
    try:
        async with transaction(state.sessions) as session:
            outcome = await act(session)
    except ReviewConflict as exc:
        ACTIONS.labels(action, "conflict").inc()
        return await _document_page(request, file_id, where, problem=str(exc), status=409)
    except ReviewRefused as exc:
        ACTIONS.labels(action, "refused").inc()
        return await _document_page(request, file_id, where, problem=str(exc), status=409)
    ACTIONS.labels(action, "done").inc()
    user = require_operator(request)  # checked before the action; here for its name
    if action == "rerun":
        notice = f"file {file_id}: attempt {outcome.attempt} queued by {user.id}"
        warning = await run_in_threadpool(state.nudges.publish_requests)
    else:
        notice = f"file {file_id} {outcome.action} by {user.id}: {outcome.file_status}"
        warning = None
        if outcome.finalized_mail_ids:
            warning = await run_in_threadpool(state.nudges.notify_final_mails)
    request.session[NOTICE] = notice + (f" ({warning})" if warning else "")
    return await _to_next(request, where, place_of(form))


async def _to_next(request: Request, where: ReviewFilter, place: Any) -> Response:
    """Redirect to the next document behind ``place`` (else from the start), or to the queue."""
    state = console_state(request)
    async with state.sessions() as session:
        found = await list_review_items(session, limit=1, where=where, after=place)
        if not found and place is not None:
            found = await list_review_items(session, limit=1, where=where)
    if not found:
        done = request.session.get(NOTICE)
        request.session[NOTICE] = (
            f"{done}; nothing left to review" if done else "nothing left to review"
        )
        return RedirectResponse(f"/review{filter_query(where)}", status_code=303)
    return RedirectResponse(f"/files/{found[0].file_id}{filter_query(where)}", status_code=303)


async def _document_page(
    request: Request,
    file_id: int,
    where: ReviewFilter,
    *,
    problem: str | None = None,
    status: int = 200,
) -> Response:
    state = console_state(request)
    recognition = state.settings.recognition
    async with state.sessions() as session:
        shown = await show_review_file(session, file_id, settings=recognition)
        if shown is None:
            raise HTTPException(404, f"file {file_id} does not exist")
        item = shown.item
        mail = await mail_by_id(session, item.mail_id) if item.mail_id is not None else None
        stored = await file_object(session, file_id)
        following = await list_review_items(
            session, limit=1, where=where, after=(item.updated_at, item.file_id)
        )
    assert stored is not None  # the file exists: show_review_file found it
    preview = preview_of(stored, state.settings.console.max_table_bytes)
    if not servable(stored, state.settings.storage):
        preview = "none"
    rows, table_problem = await _table(request, stored, preview)
    document_type = item.document.document_type if item.document else None
    return render(
        request,
        "document.html",
        {
            "shown": shown,
            "item": item,
            "mail": mail,
            "body": await mail_text(state.store, mail) if mail else None,
            "preview": preview,
            "rows": rows,
            "table_problem": table_problem,
            "inputs": field_inputs(item.document, document_type, recognition),
            "document_type": document_type,
            "types": sorted(recognition.document_types),
            "reviewable": item.status in ("NEEDS_CHECK", "ERROR"),
            "filters": filter_values(where),
            "query": filter_query(where),
            "next_id": following[0].file_id if following else None,
            "place_at": item.updated_at.isoformat(),
            "problem": problem,
            "notice": request.session.pop(NOTICE, None),
        },
        status=status,
    )


async def _table(request: Request, stored: Any, preview: str) -> tuple[list[Any], str | None]:
    """The file's first rows when it is shown as a table or text, else nothing."""
    if preview not in ("table", "text"):
        return [], None
    state = console_state(request)
    limit = state.settings.console.max_table_bytes
    try:
        if await state.store.size(stored.bucket, stored.key) > limit:
            return [], f"the file is over {limit} bytes: download it"
        data = await state.store.get(stored.bucket, stored.key)
        if preview == "text":
            return [[data.decode("utf-8", errors="replace")[:100_000]]], None
        return table_rows(data, stored.file_type, state.settings.console.max_table_rows), None
    except AppError as exc:
        return [], f"the file's object cannot be read: {exc}"
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:  # a damaged workbook
        return [], f"the file cannot be shown as a table ({type(exc).__name__}); download it"


ROUTES = [
    Route("/review", queue, name="queue"),
    Route("/review/next", next_document, name="next_document"),
    Route("/files/{file_id:int}", document, name="document"),
    Route("/files/{file_id:int}/content", content, name="content"),
    Route("/files/{file_id:int}/accept", accept, methods=["POST"], name="accept"),
    Route("/files/{file_id:int}/correct", correct, methods=["POST"], name="correct"),
    Route("/files/{file_id:int}/rerun", rerun, methods=["POST"], name="rerun"),
]
