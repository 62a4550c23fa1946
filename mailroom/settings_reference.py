"""The configuration reference in README.md, generated from the Settings class.

``python -m mailroom.settings_reference --write`` rewrites the block between the
markers; a unit test fails when the README and the settings drift apart.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from mailroom.settings import Settings

README = Path(__file__).resolve().parent.parent / "README.md"
START = "<!-- settings-reference:start -->"
END = "<!-- settings-reference:end -->"


def _default(field: FieldInfo) -> str:
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


def render() -> str:
    lines = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    lines += _rows(Settings, "MAILROOM_")
    return "\n".join(lines)


def with_reference(readme: str) -> str:
    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{render()}\n{END}{tail}"


def env_names() -> set[str]:
    """Every environment variable the settings class reads."""
    return {row.split("`")[1] for row in _rows(Settings, "MAILROOM_")}


if __name__ == "__main__" and "--write" in sys.argv:
    README.write_text(with_reference(README.read_text()))
    print(f"updated {README}")
