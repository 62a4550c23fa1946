"""Required fields of a document type: names and one-of lists, checked at load and by mapping."""

from __future__ import annotations

import json
import uuid

import pytest
from pydantic import ValidationError

from mailroom.cli.errors import describe
from mailroom.document_types import DocumentType
from mailroom.recognition.contract.models import RecognitionResult
from mailroom.recognition.mapping.run import judge
from mailroom.settings import RecognitionSettings, Settings

FUND = DocumentType(required=[["investor_name", "customer_id"], "amount"])


def test_one_of_rule_is_met_by_any_of_its_fields():
    assert FUND.missing({"investor_name": "Ada", "amount": 5}) == []
    assert FUND.missing({"customer_id": "C-1", "amount": 5}) == []
    assert FUND.missing({"investor_name": "Ada", "customer_id": "C-1", "amount": 0}) == []


def test_unmet_rules_are_reported_by_label_in_settings_order():
    assert FUND.missing({}) == ["investor_name|customer_id", "amount"]
    assert FUND.missing({"investor_name": "", "customer_id": None, "amount": 1}) == [
        "investor_name|customer_id"
    ]
    assert FUND.labels() == ["investor_name|customer_id", "amount"]


def test_older_key_required_fields_still_loads():
    assert DocumentType.model_validate({"required_fields": ["a"]}).required == ["a"]


@pytest.mark.parametrize(
    ("rules", "problem"),
    [
        ([["a", 3]], "required[0] has 3, not a field name"),
        ([[]], "required[0] must be a field name or a non-empty list of names, got []"),
        (["a", ""], "required[1] has '', not a field name"),
        ([["a", "a"]], "required[0] names a field twice"),
        ([["a|b"]], "required[0] has 'a|b': a field name has no '|'"),
        ("amount", "required must be a list of field names, got 'amount'"),
    ],
)
def test_malformed_rule_is_one_line_naming_the_variable_and_the_rule(monkeypatch, rules, problem):
    monkeypatch.setenv(
        "MAILROOM_RECOGNITION__DOCUMENT_TYPES", json.dumps({"fund": {"required": rules}})
    )
    with pytest.raises(ValidationError) as caught:
        Settings()
    failure = describe(caught.value)
    assert failure is not None
    [line] = failure.lines
    assert line.startswith(
        "mailroom: configuration error: MAILROOM_RECOGNITION__DOCUMENT_TYPES: "
        "recognition.document_types.fund: "
    )
    assert problem in line


def test_one_of_rule_loads_from_the_environment(monkeypatch):
    monkeypatch.setenv(
        "MAILROOM_RECOGNITION__DOCUMENT_TYPES",
        json.dumps({"fund": {"required": [["investor_name", "customer_id"], "amount"]}}),
    )
    assert Settings().recognition.document_types["fund"] == FUND


def _fund_result(**fields):
    return RecognitionResult.model_validate(
        {
            "schema_version": "1.0",
            "job_id": str(uuid.uuid4()),
            "document_type": "fund",
            "fields": {name: {"value": v, "confidence": 0.99} for name, v in fields.items()},
        }
    )


def test_judge_applies_one_of_rules():
    settings = RecognitionSettings(document_types={"fund": FUND})

    ok = judge(_fund_result(customer_id="C-1", amount=5), service_status="done", settings=settings)
    assert ok.file_status == "RECOGNIZED"

    missing = judge(_fund_result(amount=5), service_status="done", settings=settings)
    # a missing required field waits for a person: no error class, never re-sent
    assert missing.file_status == "NEEDS_CHECK" and missing.error_class is None
    assert missing.document["missing_fields"] == ["investor_name|customer_id"]
    assert "missing required fields: investor_name|customer_id" in missing.reason
