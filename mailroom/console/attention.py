"""The "needs a person" page and its actions: unblock a mailbox, replay a recognition job, a
notification or a dead letter. Each asks for a confirmation first and is audited with the
operator's id by the core function the CLI calls."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import redis
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from mailroom.adapters.redis_client import async_client
from mailroom.console.attention_data import read_attention
from mailroom.console.auth import User, require_operator
from mailroom.console.csrf import checked_form
from mailroom.console.metrics import ACTIONS
from mailroom.console.pages import render
from mailroom.console.state import console_state
from mailroom.db.audit import OPERATOR, add_audit_event
from mailroom.db.engine import transaction
from mailroom.errors import AppError, CursorBusy, PermanentError, ReplayRefused
from mailroom.ops.attention import NEEDS_OPERATOR, STAGES
from mailroom.ops.dead_letters import replay_dead_letters

#: Session key of the one-line notice the page shows after an action.
NOTICE = "notice"

#: What each action does, said on its confirmation page.
QUESTIONS = {
    "unblock": "Let mailbox {mailbox} ({folder}) be polled again at once, from where it stopped?",
    "replay-job": "Give file {file_id} a new recognition attempt (replays job {job_id})?",
    "replay-message": "Send notification {message_id} again? A receiver may get it twice.",
    "resolve-message": "Record that notification {message_id} was {outcome}, as its receiver says?",
    "replay-dead-letter": "Send dead letter {message_id} ({queue}) to its actor again?",
}


async def page(request: Request) -> Response:
    state = console_state(request)
    async with state.sessions() as session:
        found = await read_attention(session, state.settings)
    return render(
        request,
        "attention.html",
        {
            "found": found,
            "hints": NEEDS_OPERATOR,
            "stages": STAGES,
            "notice": request.session.pop(NOTICE, None),
        },
    )


async def unblock(request: Request) -> Response:
    async def act(form: FormData, user: User) -> str:
        from mailroom.intake.operations import unblock_mailbox

        mailbox, folder = _text(form, "mailbox"), _text(form, "folder") or None
        view = await unblock_mailbox(
            console_state(request).sessions, mailbox, folder=folder, operator=user.id
        )
        return (
            f"unblocked {view.mailbox}/{view.folder}: the next poll reads above UID {view.last_uid}"
        )

    return await _confirmed(request, "unblock", act)


async def replay_job(request: Request) -> Response:
    async def act(form: FormData, user: User) -> str:
        from mailroom.recognition.replay import replay_job as replay

        state = console_state(request)
        try:
            job_id = uuid.UUID(_text(form, "job_id"))
        except ValueError:
            raise ReplayRefused("that is not a job id") from None
        async with transaction(state.sessions) as session:
            done = await replay(
                session, job_id, actor_type=OPERATOR, actor_id=user.id, reason="console"
            )
        warning = await run_in_threadpool(state.nudges.publish_requests)
        said = f"file {done.file_id}: attempt {done.attempt} queued by {user.id}"
        return said + (f" ({warning})" if warning else "")

    return await _confirmed(request, "replay-job", act)


async def replay_message(request: Request) -> Response:
    async def act(form: FormData, user: User) -> str:
        from mailroom.delivery.replay import replay_messages

        state = console_state(request)
        settings = state.settings
        number = _text(form, "message_id")
        if not number.isdigit():
            raise ReplayRefused("that is not a message id")
        client = async_client(settings.stream_redis_url, settings.redis, attempts=1)
        try:
            # Redis first, as the CLI does: with it down nothing is replayed.
            await client.ping()
            ids = await replay_messages(
                sessions=state.sessions,
                redis=client,
                settings=settings.delivery,
                actor_id=user.id,
                message_id=int(number),
            )
        finally:
            await client.aclose()
        return f"message {', '.join(map(str, ids))} queued again by {user.id}"

    return await _confirmed(request, "replay-message", act)


async def resolve_message(request: Request) -> Response:
    async def act(form: FormData, user: User) -> str:
        from mailroom.delivery.resolve import OUTCOMES
        from mailroom.delivery.resolve import resolve_message as resolve

        number, outcome = _text(form, "message_id"), _text(form, "outcome")
        if not number.isdigit() or outcome not in OUTCOMES:
            raise ReplayRefused("give a message id and delivered or failed")
        await resolve(
            console_state(request).sessions,
            message_id=int(number),
            outcome="delivered" if outcome == "delivered" else "failed",
            actor_id=user.id,
        )
        return f"message {number} resolved as {outcome} by {user.id}"

    return await _confirmed(request, "resolve-message", act)


async def replay_dead_letter(request: Request) -> Response:
    async def act(form: FormData, user: User) -> str:
        state = console_state(request)
        queue, message_id = _text(form, "queue"), _text(form, "message_id")
        replayed = await run_in_threadpool(
            lambda: replay_dead_letters(
                state.settings, queue=queue, message_id=message_id, limit=1, rate_per_s=0
            )
        )
        async with transaction(state.sessions) as session:
            add_audit_event(
                session,
                actor_type=OPERATOR,
                actor_id=user.id,
                action="dramatiq.dead_letters_replayed",
                target="dramatiq.dead_letters",
                detail={"count": len(replayed), "message_ids": [r.message_id for r in replayed]},
            )
        if not replayed:
            raise ReplayRefused(f"dead letter {message_id} is gone (replayed or purged meanwhile)")
        return f"dead letter {message_id} sent to {replayed[0].actor_name} again by {user.id}"

    return await _confirmed(request, "replay-dead-letter", act)


async def _confirmed(
    request: Request, action: str, act: Callable[[FormData, User], Awaitable[str]]
) -> Response:
    """Ask first (a page repeating the form with ``confirm=yes``); then act and go back."""
    user = require_operator(request)
    form = await checked_form(request)
    fields = {k: v for k, v in form.items() if isinstance(v, str) and k not in ("csrf", "confirm")}
    if form.get("confirm") != "yes":
        question = QUESTIONS[action].format_map(_Blank(fields))
        return render(
            request,
            "confirm.html",
            {"question": question, "action": request.url.path, "fields": fields},
        )
    try:
        said = await act(form, user)
    except (PermanentError, CursorBusy, redis.RedisError) as exc:
        ACTIONS.labels(action, "refused").inc()
        request.session[NOTICE] = f"not done: {_said(exc)}"
    else:
        ACTIONS.labels(action, "done").inc()
        request.session[NOTICE] = said
    return RedirectResponse("/attention", status_code=303)


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


def _said(exc: Exception) -> str:
    if isinstance(exc, AppError):
        return str(exc)
    return f"Redis is unreachable ({type(exc).__name__}); nothing was changed"


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip()[:500] if isinstance(value, str) else ""


ROUTES = [
    Route("/attention", page, name="attention"),
    Route("/attention/unblock", unblock, methods=["POST"], name="unblock"),
    Route("/attention/replay-job", replay_job, methods=["POST"], name="replay_job"),
    Route("/attention/replay-message", replay_message, methods=["POST"], name="replay_message"),
    Route("/attention/resolve-message", resolve_message, methods=["POST"], name="resolve"),
    Route(
        "/attention/replay-dead-letter",
        replay_dead_letter,
        methods=["POST"],
        name="replay_dead_letter",
    ),
]
