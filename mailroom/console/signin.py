"""Signing in and out: OpenID Connect (authlib), or a name and role typed in on `mailroom dev`.

Behind a trusted proxy (``auth: proxy``) nobody signs in here: the proxy names the user
on every request. Each sign-in is an audit event with the user's id and role.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from mailroom.console.auth import ROLES, User, groups_of, role_for, sign_in
from mailroom.console.csrf import checked_form
from mailroom.console.metrics import SIGN_INS
from mailroom.console.pages import error_page, render
from mailroom.console.state import console_state
from mailroom.db.audit import OPERATOR, add_audit_event
from mailroom.db.engine import transaction

logger = logging.getLogger(__name__)

#: The OIDC client's name in authlib's registry.
PROVIDER = "oidc"


def oidc_client(request: Request) -> Any:
    """authlib's client for the configured issuer, registered once per app."""
    app_state = request.app.state
    if getattr(app_state, "oauth", None) is None:
        from authlib.integrations.starlette_client import OAuth

        settings = console_state(request).settings.console
        oauth = OAuth()
        oauth.register(
            PROVIDER,
            client_id=settings.oidc_client_id,
            client_secret=settings.oidc_client_secret.get_secret_value(),
            server_metadata_url=settings.oidc_issuer.rstrip("/")
            + "/.well-known/openid-configuration",
            client_kwargs={"scope": settings.oidc_scopes},
        )
        app_state.oauth = oauth
    return app_state.oauth.create_client(PROVIDER)


async def signin_page(request: Request) -> Response:
    settings = console_state(request).settings.console
    if settings.auth == "dev":
        return render(request, "signin.html", {"roles": ROLES})
    if settings.auth == "proxy":
        return error_page(request, 403, "sign in at the proxy in front of this console")
    base = settings.public_url.rstrip("/") or str(request.base_url).rstrip("/")
    return await oidc_client(request).authorize_redirect(request, f"{base}/auth/callback")  # type: ignore[no-any-return]


async def dev_signin(request: Request) -> Response:
    """`mailroom dev` only: a name and a role, no password."""
    settings = console_state(request).settings.console
    if settings.auth != "dev":
        raise HTTPException(404, "dev sign-in is off")
    form = await checked_form(request)
    name, role = str(form.get("name", "")).strip()[:200], form.get("role")
    if not name or role not in ROLES:
        return render(
            request,
            "signin.html",
            {"roles": ROLES, "problem": "give a name and a role"},
            status=400,
        )
    return await _signed_in(request, User(name, role))


async def oidc_callback(request: Request) -> Response:
    from authlib.integrations.base_client.errors import OAuthError

    settings = console_state(request).settings.console
    if settings.auth != "oidc":
        raise HTTPException(404, "OIDC sign-in is off")
    client = oidc_client(request)
    try:
        token = await client.authorize_access_token(request)
        claims = dict(token.get("userinfo") or {})
        if settings.roles_claim not in claims:
            claims.update(await client.userinfo(token=token))
    except OAuthError as exc:
        SIGN_INS.labels("refused").inc()
        return error_page(request, 401, f"sign-in failed: {exc.description or exc.error}")
    who = str(claims.get(settings.operator_claim) or claims.get("sub") or "")
    role = role_for(groups_of(claims.get(settings.roles_claim)), settings)
    if not who or role is None:
        SIGN_INS.labels("refused").inc()
        return error_page(
            request, 403, f"{who[:100] or 'this user'} is in no group of this console"
        )
    return await _signed_in(request, User(who[:200], role))


async def signout(request: Request) -> Response:
    await checked_form(request)
    request.session.clear()
    return RedirectResponse("/signin", status_code=303)


async def _signed_in(request: Request, user: User) -> Response:
    after = request.session.get("after_sign_in")
    sign_in(request, user)
    async with transaction(console_state(request).sessions) as session:
        add_audit_event(
            session,
            actor_type=OPERATOR,
            actor_id=user.id,
            action="console.signed_in",
            target="console",
            detail={"role": user.role},
        )
    SIGN_INS.labels("signed_in").inc()
    logger.info("%s signed in to the console as %s", user.id, user.role)
    # Only a path of this site: "//host" and "/\\host" would leave it.
    target = after if isinstance(after, str) else ""
    if not target.startswith("/") or target[1:2] in ("/", "\\"):
        target = "/review"
    return RedirectResponse(target, status_code=303)


ROUTES = [
    Route("/signin", signin_page, name="signin"),
    Route("/signin", dev_signin, methods=["POST"], name="dev_signin"),
    Route("/auth/callback", oidc_callback, name="oidc_callback"),
    Route("/signout", signout, methods=["POST"], name="signout"),
]
