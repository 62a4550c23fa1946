"""The configuration reference of the docs (``docs/pages/configuration.md``), generated from the
Settings class.

``python -m mailroom.settings.reference --write`` rewrites the block between the
markers; a unit test fails when the page and the settings drift apart.
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from mailroom.settings import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "pages" / "configuration.md"
START = "<!-- settings-reference:start -->"
END = "<!-- settings-reference:end -->"


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "(required)"
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(group)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return "`" + str([item.model_dump(mode="json") for item in value])[:60] + "…`"
    if hasattr(value, "get_secret_value"):
        return "(secret)"
    text = str(value)
    return f"`{text}`" if text else "(empty)"


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """The ``#:`` comments above each field in the class source: the settings' documentation."""
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(model).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+)\s*:", stripped)
        if match and pending:
            found[match.group(1)] = " ".join(pending)
        pending = []
    return found


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    comments = _comments(model)
    for name, field in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        annotation = field.annotation
        default = field.default
        if isinstance(default, BaseModel) and isinstance(annotation, type):
            rows += _rows(annotation, f"{env}__")
            continue
        kind = getattr(annotation, "__name__", str(annotation)).replace("|", "or")
        doc = (field.description or comments.get(name, "")).replace("|", "/")
        rows.append(f"| `{env}` | {kind} | {_default(field)} | {doc} |")
    return rows


def _item_models(model: type[BaseModel], prefix: str) -> list[tuple[str, type[BaseModel]]]:
    """(variable, item model) of every list or mapping of models, such as the mailboxes."""
    found = []
    for name, field in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        if isinstance(field.default, BaseModel) and isinstance(field.annotation, type):
            found += _item_models(field.annotation, f"{env}__")
            continue
        origin, args = typing.get_origin(field.annotation), typing.get_args(field.annotation)
        item = args[-1] if origin in (list, dict) and args else None
        if isinstance(item, type) and issubclass(item, BaseModel):
            found.append((env, item))
    return found


def _item_rows(model: type[BaseModel]) -> list[str]:
    comments = _comments(model)
    rows = []
    for name, field in model.model_fields.items():
        kind = getattr(field.annotation, "__name__", str(field.annotation)).replace("|", "or")
        doc = (field.description or comments.get(name, "")).replace("|", "/")
        # A default that depends on another key (a port by ``security``) is in the comment.
        default = "(see meaning)" if doc.startswith("Default:") else _default(field)
        rows.append(f"| `{name}` | {kind} | {default} | {doc} |")
    return rows


def render() -> str:
    lines = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    lines += _rows(Settings, "MAILROOM_")
    for env, item in _item_models(Settings, "MAILROOM_"):
        lines += ["", f"Keys of each item of `{env}` (JSON):", ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        lines += _item_rows(item)
    return "\n".join(lines)


def with_reference(page: str) -> str:
    head, _, rest = page.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{render()}\n{END}{tail}"


def env_names() -> set[str]:
    """Every environment variable the settings class reads."""
    return {row.split("`")[1] for row in _rows(Settings, "MAILROOM_")}


if __name__ == "__main__" and "--write" in sys.argv:
    PAGE.write_text(with_reference(PAGE.read_text()))
    print(f"updated {PAGE}")
