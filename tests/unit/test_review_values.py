"""Corrected field values are parsed into their field's type, or refused in one line."""

from __future__ import annotations

import pytest

from mailroom.document_types import DocumentType
from mailroom.errors import ReviewRefused
from mailroom.recognition.review.values import parse_value, typed_corrections


@pytest.mark.parametrize(
    ("text", "kind", "stored"),
    [
        ("510", "number", 510),
        ("510.25", "number", 510.25),
        (" 42 ", "integer", 42),
        ("2030-01-31", "date", "2030-01-31"),
        ("yes", "boolean", True),
        ("False", "boolean", False),
        ("510", "text", "510"),
        ("", "number", ""),  # an empty value clears the field
    ],
)
def test_a_value_is_stored_as_its_field_type(text, kind, stored):
    value = parse_value("f", text, kind)
    assert value == stored and type(value) is type(stored)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("lots", "number"),
        ("nan", "number"),
        ("5.5", "integer"),
        ("31.01.2030", "date"),
        ("maybe", "boolean"),
    ],
)
def test_a_value_that_does_not_parse_is_refused_naming_the_field_and_type(text, kind):
    with pytest.raises(ReviewRefused, match=f"field 'f' takes an? {kind}"):
        parse_value("f", text, kind)


def test_the_document_types_declaration_wins_else_the_current_values_type():
    fund = DocumentType(field_types={"amount": "number", "due": "date"})
    current = {"amount": "500", "count": 3, "ratio": 0.5, "note": "x"}
    typed = typed_corrections(
        {"amount": "510", "due": "2030-01-31", "count": "4", "ratio": "1", "note": "7"},
        current,
        fund,
    )
    assert typed == {"amount": 510, "due": "2030-01-31", "count": 4, "ratio": 1, "note": "7"}
    with pytest.raises(ReviewRefused, match="field 'count' takes an integer"):
        typed_corrections({"count": "four"}, current, fund)
