"""The review pages' forms: the queue's filters, and a document's fields as inputs typed by
its document type."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import FormData, QueryParams

from mailroom.document_types import FieldType
from mailroom.recognition.review.queries import REASONS, ReviewDocument, ReviewFilter
from mailroom.recognition.review.values import type_of
from mailroom.settings import RecognitionSettings

#: Names of the filter parameters, in the order the queue's form shows them.
FILTERS = ("mailbox", "sender", "type", "reason")
#: Prefix of a field's input in the correct form.
FIELD_PREFIX = "field."


def review_filter(params: QueryParams | FormData) -> ReviewFilter:
    """The filters a query string (or a form's hidden inputs) carries; unknown reasons ignored."""

    def given(name: str) -> str | None:
        value = params.get(name)
        return value.strip()[:200] or None if isinstance(value, str) else None

    reason = given("reason")
    return ReviewFilter(
        mailbox=given("mailbox"),
        sender=given("sender"),
        document_type=given("type"),
        reason=reason if reason in REASONS else None,
    )


def filter_values(where: ReviewFilter) -> dict[str, str]:
    """The filters as form and query values (empty ones left out)."""
    values = {
        "mailbox": where.mailbox,
        "sender": where.sender,
        "type": where.document_type,
        "reason": where.reason,
    }
    return {name: value for name, value in values.items() if value}


def filter_query(where: ReviewFilter, **extra: str) -> str:
    """``?mailbox=…&reason=…`` (or empty) for links that keep the queue's filters."""
    values = {**filter_values(where), **extra}
    return f"?{urlencode(values)}" if values else ""


def place_of(form: FormData) -> tuple[datetime, int] | None:
    """The queue place a document page was at (its hidden ``after_at`` and ``after_id``)."""
    at, file_id = form.get("after_at"), form.get("after_id")
    if not isinstance(at, str) or not isinstance(file_id, str) or not file_id.isdigit():
        return None
    try:
        return datetime.fromisoformat(at), int(file_id)
    except ValueError:
        return None


@dataclass(frozen=True)
class FieldInput:
    """One field of the correct form."""

    name: str
    kind: FieldType
    value: str
    confidence: Any
    missing: bool
    low: bool

    @property
    def input_name(self) -> str:
        return FIELD_PREFIX + self.name


def shown(value: Any) -> str:
    """A field's value as its input holds it (``true``/``false``, numbers as written)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_inputs(
    document: ReviewDocument | None, document_type: str | None, settings: RecognitionSettings
) -> list[FieldInput]:
    """Every field of the document and every field its type names, typed and flagged."""
    doc_type = settings.document_types.get(document_type or "")
    fields = dict(document.fields) if document else {}
    names = set(fields)
    missing_labels = set(document.missing) if document else set()
    if doc_type is not None:
        names |= set(doc_type.field_types)
        for rule in doc_type.required:
            names |= {rule} if isinstance(rule, str) else set(rule)
    missing = {name for label in missing_labels for name in label.split("|")}
    low = set(document.low_confidence) if document else set()
    typed = doc_type.field_types if doc_type else {}
    return [
        FieldInput(
            name=name,
            kind=typed.get(name) or type_of(fields.get(name)),
            value=shown(fields.get(name)),
            confidence=document.field_confidence.get(name) if document else None,
            missing=name in missing,
            low=name in low,
        )
        for name in sorted(names)
    ]


def corrections_of(form: FormData, inputs: list[FieldInput]) -> dict[str, str]:
    """The fields whose posted value differs from what the page showed."""
    before = {field.name: field.value for field in inputs}
    changed = {}
    for key, value in form.multi_items():
        if not key.startswith(FIELD_PREFIX) or not isinstance(value, str):
            continue
        name = key.removeprefix(FIELD_PREFIX)
        if name in before and before[name] != value:
            changed[name] = value
    return changed
