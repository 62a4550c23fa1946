"""A mail's whole story on one page, and the search that finds it (Message-ID, sender, id)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from mailroom.console.mails import mail_story, mail_text, search_mails
from mailroom.console.pages import error_page, render
from mailroom.console.state import console_state


async def story(request: Request) -> Response:
    state = console_state(request)
    mail_id = int(request.path_params["mail_id"])
    async with state.sessions() as session:
        found = await mail_story(session, mail_id)
    if found is None:
        return error_page(request, 404, f"mail {mail_id} does not exist")
    body = await mail_text(state.store, found.mail)
    return render(request, "story.html", {"story": found, "mail": found.mail, "body": body})


async def search(request: Request) -> Response:
    """Mails matching ``q``; straight to the story when exactly one does."""
    query = request.query_params.get("q", "").strip()[:500]
    state = console_state(request)
    async with state.sessions() as session:
        found = await search_mails(session, query)
    if len(found) == 1:
        return RedirectResponse(f"/mails/{found[0].id}", status_code=303)
    return render(request, "search.html", {"query": query, "mails": found})


ROUTES = [
    Route("/mails/{mail_id:int}", story, name="story"),
    Route("/search", search, name="search"),
]
