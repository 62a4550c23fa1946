"""The rule book: its decisions, and the documentation rendered from it."""

from __future__ import annotations

import json
import uuid

import pytest

from mailroom.errors import InvalidMessage
from mailroom.recognition.contract import rules
from mailroom.recognition.contract.models import RecognitionResponse

JOB_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def _answer(**changes) -> bytes:
    body = {
        "schema_version": rules.CONTRACT_VERSION,
        "job_id": str(JOB_ID),
        "file_id": 7,
        "status": "error",
        "error": {"code": "UNREADABLE", "message": "not a CSV file"},
    }
    body.update(changes)
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


def test_the_documented_rules_are_the_rule_books():
    page = rules.DOCS_PAGE.read_text()
    assert "<!-- contract-rules:start -->" in page
    assert rules.with_rules(page) == page, (
        "the rules in docs/pages/recognition-service.md are stale: run `make contracts`"
    )


def test_every_error_code_has_one_class():
    for code in (*rules.SERVICE_ERROR_CODES, *rules.MAILROOM_ERROR_CODES):
        assert rules.error_class(code.code) == code.error_class
    classes = {e.code: e.error_class for e in rules.MAILROOM_ERROR_CODES}
    assert classes["TIMEOUT"] == "retryable"
    assert classes["INVALID_RESULT"] == "permanent"


@pytest.mark.parametrize(
    ("code", "permanent", "expected"),
    [
        ("UNSUPPORTED_TYPE", None, "permanent"),
        ("INTERNAL_ERROR", None, "retryable"),
        ("OCR_FAILED", None, "retryable"),  # not listed: retryable
        (None, None, "retryable"),  # no code: SERVICE_ERROR
        ("INTERNAL_ERROR", True, "permanent"),  # the service's mark wins
        ("NOT_FOUND", False, "retryable"),
    ],
)
def test_the_services_mark_decides_else_the_codes_class(code, permanent, expected):
    assert rules.error_class(code, permanent=permanent) == expected


def test_only_retryable_errors_below_the_attempts_are_retried_never_a_check():
    assert rules.is_retried("retryable", attempt=1, automatic_attempts=2)
    assert not rules.is_retried("retryable", attempt=2, automatic_attempts=2)
    assert not rules.is_retried("permanent", attempt=1, automatic_attempts=2)
    assert not rules.is_retried(None, attempt=1, automatic_attempts=2), "NEEDS_CHECK"


def test_a_string_file_id_breaks_the_contract():
    with pytest.raises(InvalidMessage) as refused:
        rules.read_answer(_answer(file_id="7"))
    assert refused.value.reason == "not the contract (file_id)"
    assert str(refused.value.job_id) == str(JOB_ID), "it names its job: the job fails"
    assert (
        rules.contract_problem(_answer(file_id="7")) == "file_id: Input should be a valid integer"
    )
    assert rules.contract_problem(_answer()) is None


def test_the_permanent_mark_is_a_json_boolean():
    assert rules.read_answer(_answer(error={"code": "X", "permanent": True})).error.permanent
    assert rules.contract_problem(_answer(error={"code": "X", "permanent": "yes"}))


def test_an_answer_of_the_previous_version_reads_as_before_another_major_does_not():
    old = rules.read_answer(_answer(schema_version="1.0", error={"code": "INTERNAL_ERROR"}))
    assert rules.answer_error_class(old) == "retryable"
    assert rules.read_answer(_answer(schema_version=None)).status == "error"
    with pytest.raises(InvalidMessage):
        rules.read_answer(_answer(schema_version="2.0"))


def test_a_missing_msg_id_warns_a_wrong_one_fails_and_the_inbox_derives_the_same():
    missing = rules.msg_id_finding(None, JOB_ID, 1, ack=False)
    assert missing.level == "warn" and f"{JOB_ID}:1:result" in missing.detail
    assert rules.answer_msg_id(None, JOB_ID, 1, ack=False) == f"{JOB_ID}:1:result"
    assert rules.msg_id_finding(f"{JOB_ID}:2:result", JOB_ID, 1, ack=False).level == "fail"
    assert rules.msg_id_finding(f"{JOB_ID}:1:result", JOB_ID, 1, ack=True).level == "fail"
    assert rules.msg_id_finding(f"{JOB_ID}:1:ack", JOB_ID, 1, ack=True).level == "pass"


def test_a_result_before_its_ack_or_without_one_is_a_warning():
    assert rules.ordering_finding(1.0, 2.0).level == "pass"
    assert rules.ordering_finding(2.0, 1.0).level == "warn"
    assert rules.ordering_finding(None, 1.0).level == "warn"


def test_the_outcome_says_what_mailroom_does():
    def outcome(**changes):
        response = RecognitionResponse.model_validate_json(_answer(**changes))
        return rules.outcome_of(response, automatic_attempts=2)

    assert outcome() == "UNREADABLE is permanent: the file ends ERROR, never re-sent"
    assert outcome(error={"code": "INTERNAL_ERROR"}) == (
        "INTERNAL_ERROR is retryable: re-sent as a new attempt"
    )
    ref = {"bucket": "mailroom-results", "key": "r.json"}
    assert "never re-sent" in outcome(status="needs_check", error=None, result_s3=ref)


def test_the_models_read_exactly_the_majors_the_rule_book_reads():
    read = {rules.CURRENT_MAJOR, *rules.PREVIOUS_MAJORS_READ_UNTIL}
    for major in range(10):
        accepted = rules.contract_problem(_answer(schema_version=f"{major}.0")) is None
        assert accepted is (major in read), f"schema_version {major}.0"


def test_a_previous_major_is_read_with_a_warning_until_its_stated_day(monkeypatch):
    assert rules.version_finding("1.0").level == "pass"
    assert rules.version_finding("2.0").level == "fail"
    # The day the contract goes to 2.x: 1.x answers are read for the stated window, warned.
    monkeypatch.setattr(rules, "CURRENT_MAJOR", 2)
    monkeypatch.setattr(rules, "PREVIOUS_MAJORS_READ_UNTIL", {1: "2028-06-30"})
    warned = rules.version_finding("1.1")
    assert warned.level == "warn" and "until 2028-06-30" in warned.detail
    assert rules.version_finding("0.9").level == "fail"
