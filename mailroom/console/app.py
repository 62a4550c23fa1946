"""The console's ASGI application: routes, sessions, sign-in, and the security headers."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mailroom.console import attention, review, signin, story
from mailroom.console.auth import SignInRequired
from mailroom.console.pages import error_page
from mailroom.console.state import ConsoleState, Nudges
from mailroom.db.engine import create_engine, create_sessionmaker
from mailroom.settings import Settings

STATIC = Path(__file__).parent / "static"
#: Name of the session cookie.
SESSION_COOKIE = "mailroom_console"

#: Scripts and styles only from the console itself, none inline; files framed only here.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "frame-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'self'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"SAMEORIGIN"),
]


class SecurityHeaders:
    """Every response carries the Content-Security-Policy and its companions."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


async def _home(request: Request) -> Response:
    return RedirectResponse("/review", status_code=303)


async def _health(request: Request) -> Response:
    return PlainTextResponse("ok")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_page(request, exc.status_code, exc.detail)


def build_app(settings: Settings, *, nudges: Nudges) -> Starlette:
    """The console on ``settings``' database and object store.

    The database engine lives from the app's start to its stop (its lifespan), on the
    server's event loop. The session key is the settings' (a random one in `mailroom dev`).
    """
    from mailroom.adapters.storage import build_store

    console = settings.console
    key = console.session_secret.get_secret_value() or secrets.token_urlsafe(32)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine = create_engine(settings.database)
        app.state.console = ConsoleState(
            settings, create_sessionmaker(engine), build_store(settings), nudges
        )
        try:
            yield
        finally:
            await engine.dispose()

    return Starlette(
        routes=[
            Route("/", _home),
            Route("/healthz", _health),
            *signin.ROUTES,
            *review.ROUTES,
            *attention.ROUTES,
            *story.ROUTES,
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(
                SessionMiddleware,
                secret_key=key,
                session_cookie=SESSION_COOKIE,
                max_age=console.session_max_age_s,
                same_site="lax",
                https_only=console.secure_cookies,
            ),
            Middleware(SignInRequired, settings=console),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
