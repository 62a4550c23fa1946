"""CSRF protection: every form carries the session's token, every POST is checked against it.

The token lives in the signed session cookie (SameSite=Lax); a form posted from
another site has neither the cookie's token nor a way to read it.
"""

from __future__ import annotations

import secrets

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request

#: Name of the form field (and session key) holding the token.
FIELD = "csrf"


def csrf_token(request: Request) -> str:
    """The session's token, made at its first form."""
    token = request.session.get(FIELD)
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        request.session[FIELD] = token
    return token


async def checked_form(request: Request) -> FormData:
    """The posted form, once its token matches the session's; 403 otherwise."""
    form = await request.form()
    given, expected = form.get(FIELD), request.session.get(FIELD)
    if (
        not isinstance(given, str)
        or not isinstance(expected, str)
        or not secrets.compare_digest(given, expected)
    ):
        raise HTTPException(
            403, "the form's CSRF token is missing or stale: reload the page and try again"
        )
    return form
