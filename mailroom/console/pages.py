"""Rendering pages: one Jinja2 environment that escapes everything, and the error page.

Every string from a mail (sender, subject, file names, field values, reasons) reaches
a page through a template with autoescape on for every template, whatever its name;
nothing is marked safe.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from mailroom.console.csrf import csrf_token
from mailroom.ops.attention import format_age

TEMPLATES = Path(__file__).parent / "templates"


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _confidence(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["confidence"] = _confidence
    env.filters["age"] = format_age
    return env


templates = Jinja2Templates(env=_environment())


def render(
    request: Request, name: str, context: dict[str, Any] | None = None, *, status: int = 200
) -> Response:
    """``name`` with the signed-in user, the CSRF token and ``context``."""
    user = getattr(request.state, "user", None)
    full = {"user": user, "csrf": csrf_token(request), "notice": None, "problem": None}
    full.update(context or {})
    return templates.TemplateResponse(request, name, full, status_code=status)


def error_page(request: Request, status: int, detail: str) -> Response:
    """One line saying what went wrong, in the page layout."""
    return render(request, "error.html", {"status": status, "detail": detail}, status=status)
