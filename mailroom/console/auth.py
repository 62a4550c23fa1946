"""Who is asking, and may they act: OIDC sign-in, a trusted proxy's header, or dev sign-in.

Two roles: a ``viewer`` looks, an ``operator`` also acts. The role comes from the
user's groups (an OIDC claim or the proxy's header) through the settings' group lists;
a user in neither list is refused. The session cookie is signed, HttpOnly, SameSite=Lax
and, outside `mailroom dev`, Secure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from typing import Any, Literal

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from mailroom.console.pages import error_page
from mailroom.settings import ConsoleSettings

Role = Literal["viewer", "operator"]
ROLES: tuple[Role, ...] = ("viewer", "operator")

#: Session key of the signed-in user.
SESSION_USER = "user"
#: Paths anyone may reach (signing in, the style sheet and script, the health check).
PUBLIC_PREFIXES = ("/signin", "/auth/", "/static/", "/healthz")


@dataclass(frozen=True)
class User:
    """A signed-in person: the id written to the audit trail, and their role."""

    id: str
    role: Role

    @property
    def may_act(self) -> bool:
        return self.role == "operator"


def role_for(groups: Iterable[str], settings: ConsoleSettings) -> Role | None:
    """``operator`` if any group makes one, else ``viewer`` if any does, else None."""
    given = set(groups)
    if given & set(settings.operator_groups):
        return "operator"
    if given & set(settings.viewer_groups):
        return "viewer"
    return None


def groups_of(value: Any) -> list[str]:
    """A claim's or header's groups: a list, or one comma-separated string."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple):
        return [str(part) for part in value]
    return []


def from_trusted_proxy(request: Request, settings: ConsoleSettings) -> bool:
    """Did the request come straight from one of the configured proxies?"""
    if request.client is None:
        return False
    try:
        address = ip_address(request.client.host)
    except ValueError:
        return False
    return any(address in ip_network(net, strict=False) for net in settings.trusted_proxies)


def user_of(request: Request, settings: ConsoleSettings) -> User | None:
    """The request's user: the proxy's header (``proxy``), else the session's."""
    if settings.auth == "proxy":
        if not from_trusted_proxy(request, settings):
            raise HTTPException(403, "this console is reached only through its proxy")
        name = request.headers.get(settings.proxy_user_header, "").strip()
        if not name:
            return None
        role = role_for(groups_of(request.headers.get(settings.proxy_groups_header, "")), settings)
        if role is None:
            raise HTTPException(403, f"{name[:100]} is in no group allowed to use this console")
        return User(name[:200], role)
    found = request.session.get(SESSION_USER)
    if isinstance(found, dict) and found.get("role") in ROLES and found.get("id"):
        return User(str(found["id"]), found["role"])
    return None


def sign_in(request: Request, user: User) -> None:
    """Start a session for ``user`` (a new CSRF token with it)."""
    request.session.clear()
    request.session[SESSION_USER] = {"id": user.id, "role": user.role}


def current_user(request: Request) -> User:
    user: User = request.state.user
    return user


def require_operator(request: Request) -> User:
    """The signed-in operator; 403 for a viewer."""
    user = current_user(request)
    if not user.may_act:
        raise HTTPException(403, f"{user.id} is a viewer: only operators act")
    return user


class SignInRequired:
    """Every page but the public ones needs a user: a page is sent to sign-in, a POST refused."""

    def __init__(self, app: ASGIApp, settings: ConsoleSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(PUBLIC_PREFIXES):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            user = user_of(request, self.settings)
        except HTTPException as exc:
            await error_page(request, exc.status_code, exc.detail)(scope, receive, send)
            return
        if user is None:
            if request.method in ("GET", "HEAD"):
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                request.session["after_sign_in"] = target
                await RedirectResponse("/signin", status_code=303)(scope, receive, send)
                return
            await error_page(request, 401, "sign in first")(scope, receive, send)
            return
        scope.setdefault("state", {})["user"] = user
        await self.app(scope, receive, send)
