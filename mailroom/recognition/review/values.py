"""An operator's corrected field value, parsed into the type its field holds.

The type is the document type's ``field_types`` entry, else the type of the value
the field holds now (a number found by recognition stays a number): ``amount=510``
is stored as the number 510, not the text "510". A value that does not parse is
refused before anything is written. An empty value clears the field, whatever its type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import date
from typing import Any

from mailroom.document_types import DocumentType, FieldType
from mailroom.errors import ReviewRefused

_TRUE = frozenset({"true", "yes", "1"})
_FALSE = frozenset({"false", "no", "0"})


def typed_corrections(
    corrections: Mapping[str, str], current: Mapping[str, Any], document_type: DocumentType
) -> dict[str, Any]:
    """Each corrected value parsed into its field's type; ``ReviewRefused`` naming the first bad one."""
    return {
        name: parse_value(
            name, value, document_type.field_types.get(name) or type_of(current.get(name))
        )
        for name, value in corrections.items()
    }


def type_of(value: Any) -> FieldType:
    """The field type of a value a document holds (text for text, null and anything else)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "text"


def parse_value(name: str, text: str, kind: FieldType) -> Any:
    """``text`` as a value of ``kind``; ``""`` stays ``""`` (the field is cleared)."""
    given = text.strip()
    if kind == "text" or not given:
        return text
    try:
        if kind == "integer":
            return int(given)
        if kind == "number":
            return _number(given)
        if kind == "date":
            return date.fromisoformat(given).isoformat()
        if given.lower() in _TRUE | _FALSE:
            return given.lower() in _TRUE
        raise ValueError(given)
    except ValueError:
        example = {"integer": "42", "number": "510.25", "date": "2030-01-31"}.get(kind, "true")
        article = "an" if kind == "integer" else "a"
        raise ReviewRefused(
            f"field {name!r} takes {article} {kind} (like {example}): {text[:60]!r} is not one"
        ) from None


def _number(given: str) -> int | float:
    """An integer when it is written as one (510), else a finite float (510.25)."""
    try:
        return int(given)
    except ValueError:
        value = float(given)
    if not math.isfinite(value):
        raise ValueError(given)
    return value
