"""The rule book of the exchange with recognition services: every rule, stated once.

The inbox reads answers with :func:`read_answer` and names them with :func:`answer_msg_id`,
mapping and the watchdog retry a failed attempt only when :func:`is_retried` says so, and
``mailroom recognizer check`` judges a live service with the same functions
(:func:`msg_id_finding`, :func:`ordering_finding`, :func:`outcome_of`), so the system and its
checker cannot disagree. The rules of "Writing a recognition service" and the error codes of
``contracts/asyncapi.json`` are rendered from this module (``make contracts``); unit tests fail
when either drifts.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from mailroom.errors import InvalidMessage
from mailroom.recognition.contract.models import (
    MSG_ID_HEADER,
    SCHEMA_VERSION,
    SERVICE_ERROR,
    UNKNOWN_SERVICE,
    RecognitionResponse,
    ack_msg_id,
    parse_json_object,
    result_msg_id,
)
from mailroom.settings import RecognitionSettings

#: The contract's version: ``schema_version`` of every message and ``info.version`` of
#: ``asyncapi.json``. 1.1 added ``error.permanent``; a 1.0 answer reads as before.
CONTRACT_VERSION = SCHEMA_VERSION
#: What a minor and a major version promise (the documentation's "Versions").
VERSION_POLICY = (
    "A minor version (`1.0` → `1.1`) only adds optional fields, which readers ignore: a service "
    "of any `1.x` keeps working unchanged. A change that breaks a service (a field becomes "
    "required, a value changes its meaning) bumps the major; Mailroom then still reads answers "
    "of the previous major, by that major's rules, for 12 months after the release that bumped "
    "it, and `mailroom recognizer check` warns about them. A major Mailroom does not read is "
    "refused like any message off the contract."
)

#: The major Mailroom speaks, and the previous majors it still reads with the last day each is
#: read (ISO date, 12 months after the release that bumped the major). The models' version
#: pattern reads exactly these majors (a unit test holds them together).
CURRENT_MAJOR = int(CONTRACT_VERSION.split(".")[0])
PREVIOUS_MAJORS_READ_UNTIL: dict[int, str] = {}

ErrorClass = Literal["retryable", "permanent"]
#: What the checker makes of one thing a service did: kept, tolerated, or broken.
Level = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class ErrorCode:
    """One error code of the contract: who sets it, whether a new attempt may help."""

    code: str
    error_class: ErrorClass
    meaning: str


#: Codes a service puts in ``error.code``. A code not listed is ``retryable`` unless the
#: answer says ``error.permanent: true``.
SERVICE_ERROR_CODES: tuple[ErrorCode, ...] = (
    ErrorCode(
        "INVALID_REQUEST",
        "permanent",
        "The request breaks the contract or names an object it may not read.",
    ),
    ErrorCode("NOT_FOUND", "permanent", "The file is not in the object store at `s3`."),
    ErrorCode("UNREADABLE", "permanent", "The file is not readable as its `file_type`."),
    ErrorCode("EMPTY", "permanent", "The file holds no data."),
    ErrorCode("UNSUPPORTED_TYPE", "permanent", "The service does not handle this `file_type`."),
    ErrorCode(
        "STORAGE_UNAVAILABLE", "retryable", "The object store could not be reached (transient)."
    ),
    ErrorCode("INTERNAL_ERROR", "retryable", "The service failed (transient)."),
    ErrorCode(
        SERVICE_ERROR, "retryable", "Recorded by Mailroom for an `error` answer that gives no code."
    ),
)

#: Codes Mailroom sets on a job itself; a service never sends them.
MAILROOM_ERROR_CODES: tuple[ErrorCode, ...] = (
    ErrorCode(
        "INVALID_REQUEST",
        "permanent",
        "The request could not be built from the contract; never sent.",
    ),
    ErrorCode(
        "NO_ACK",
        "permanent",
        "No ack after every republish: the job is dead-lettered (`dlq`). Not re-sent (the "
        "request already went out `max_republish + 1` times); a later genuine answer still "
        "revives it, and an operator may replay it.",
    ),
    ErrorCode(
        "TIMEOUT",
        "retryable",
        "No result before `reply_deadline` although the service took the request (a result "
        "lost on its way, a replica that died).",
    ),
    ErrorCode(
        "INVALID_RESULT",
        "permanent",
        "An answer or its result document breaks the contract (not JSON, not the schema, a "
        "string `file_id`, a document missing, unreadable or naming another job): the service "
        "would answer the same way again.",
    ),
    ErrorCode("RESULT_FOREIGN_BUCKET", "permanent", "`result_s3` is outside the results bucket."),
    ErrorCode(
        "RESULT_TOO_LARGE", "permanent", "The result document is larger than `max_result_bytes`."
    ),
    ErrorCode(
        "INBOX_ATTEMPTS_EXHAUSTED",
        "permanent",
        "Applying the answer kept killing Mailroom's workers.",
    ),
    ErrorCode(
        "MAPPING_ATTEMPTS_EXHAUSTED",
        "permanent",
        "Mapping the result kept killing Mailroom's workers.",
    ),
)

_CLASSES: dict[str, ErrorClass] = {
    e.code: e.error_class for e in (*SERVICE_ERROR_CODES, *MAILROOM_ERROR_CODES)
}
#: Longest service name kept as a label or in a log line (the name comes from the message).
MAX_SERVICE_CHARS = 64
#: ``metrics`` key of a job's error class, recorded when its ``error`` answer is applied.
ERROR_CLASS_KEY = "error_class"


def error_class(code: str | None, *, permanent: bool | None = None) -> ErrorClass:
    """The class of an error: the service's ``error.permanent`` when given, else the code's.

    A code the contract does not list is retryable: a new attempt is bounded, a wrong
    ``permanent`` would end a file a second try could read.
    """
    if permanent is not None:
        return "permanent" if permanent else "retryable"
    return _CLASSES.get(code or SERVICE_ERROR, "retryable")


def is_retried(error: ErrorClass | None, *, attempt: int, automatic_attempts: int) -> bool:
    """Whether a failed attempt is re-sent to recognition as a new one (``attempt + 1``).

    ``error`` is None for a file that needs a check (the service said so, a required field
    is missing, a confidence is low): that waits for a person, never for another job.
    """
    return error == "retryable" and attempt < automatic_attempts


def answer_error_class(response: RecognitionResponse) -> ErrorClass | None:
    """The error class of an ``error`` answer; None for any other status."""
    if response.status != "error":
        return None
    error = response.error
    return error_class(error.code if error else None, permanent=error.permanent if error else None)


def read_answer(data: bytes) -> RecognitionResponse:
    """The answer in ``data`` if the contract accepts it; else ``InvalidMessage`` saying why.

    A JSON object of ``recognition_response.schema.json``, types exact (a string
    ``file_id`` is refused, not converted), ``result_s3`` for ``done`` / ``needs_check``.
    """
    try:
        # One pass of pydantic's parser over the bytes: a third cheaper than the dict first.
        response = RecognitionResponse.model_validate_json(data)
    except (ValidationError, ValueError, RecursionError):
        return _read_in_steps(data)  # the reason, read as below
    if response.status in ("done", "needs_check") and response.result_s3 is None:
        return _read_in_steps(data)
    return response


def _read_in_steps(data: bytes) -> RecognitionResponse:
    """JSON first, then the contract: why a message is refused, and the job it names."""
    try:
        body = parse_json_object(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidMessage("not a JSON object", None, kind="not_json") from exc
    try:
        response = RecognitionResponse.model_validate(body)
    except ValidationError as exc:
        fields = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})[:5]
        reason = f"not the contract ({', '.join(fields)})"
        raise InvalidMessage(reason, body.get("job_id"), service=service_of(body)) from exc
    if response.status in ("done", "needs_check") and response.result_s3 is None:
        reason = f"{response.status} without result_s3"
        raise InvalidMessage(
            reason, body.get("job_id"), kind="missing_result_s3", service=service_of(body)
        )
    return response


def service_of(body: object) -> str:
    """The ``service.name`` a broken message gave, cleaned for labels; ``unknown`` if none."""
    service = body.get("service") if isinstance(body, dict) else None
    name = service.get("name") if isinstance(service, dict) else None
    if not isinstance(name, str):
        return UNKNOWN_SERVICE
    cleaned = "".join(c for c in name if c.isprintable())[:MAX_SERVICE_CHARS].strip()
    return cleaned or UNKNOWN_SERVICE


def contract_problem(data: bytes) -> str | None:
    """Why ``data`` is not an answer the contract accepts, for people; None when it is."""
    try:
        read_answer(data)
    except InvalidMessage as exc:
        cause = exc.__cause__
        if isinstance(cause, ValidationError):
            first = cause.errors(include_url=False, include_input=False)[0]
            where = ".".join(map(str, first["loc"])) or "message"
            return f"{where}: {first['msg']}"
        return exc.reason
    return None


def expected_msg_id(job_id: uuid.UUID | str, attempt: int, *, ack: bool) -> str:
    """The ``Nats-Msg-Id`` of an ack or a result of one attempt."""
    return (ack_msg_id if ack else result_msg_id)(job_id, attempt)


def answer_msg_id(msg_id: str | None, job_id: uuid.UUID, attempt: int, *, ack: bool) -> str:
    """The msg id an answer is recorded under: its header, or when it has none the one it
    should have carried (accepted with a warning, see :data:`RULES`)."""
    return msg_id if msg_id is not None else expected_msg_id(job_id, attempt, ack=ack)


@dataclass(frozen=True)
class Finding:
    """What the rule book makes of one thing a service did."""

    level: Level
    detail: str


def msg_id_finding(
    msg_id: str | None, job_id: uuid.UUID | str, attempt: int, *, ack: bool
) -> Finding:
    """An answer's ``Nats-Msg-Id`` against the rule: the exact id passes, none is tolerated."""
    expected = expected_msg_id(job_id, attempt, ack=ack)
    if msg_id is None:
        return Finding(
            "warn",
            f"no {MSG_ID_HEADER}: Mailroom accepts it as {expected!r} and logs a warning, "
            "but JetStream cannot drop its repeats",
        )
    if msg_id != expected:
        return Finding("fail", f"{MSG_ID_HEADER} {msg_id!r}, expected {expected!r}")
    return Finding("pass", expected)


def version_finding(version: str) -> Finding:
    """An answer's ``schema_version``: the current major passes, a previous one still read warns."""
    major = version.split(".", 1)[0]
    if major == str(CURRENT_MAJOR):
        return Finding("pass", version)
    until = PREVIOUS_MAJORS_READ_UNTIL.get(int(major)) if major.isdigit() else None
    if until is not None:
        return Finding(
            "warn",
            f"schema_version {version}: Mailroom reads it until {until}; move to "
            f"{CONTRACT_VERSION}",
        )
    return Finding("fail", f"schema_version {version}: Mailroom reads {CURRENT_MAJOR}.x only")


def ordering_finding(ack_at_s: float | None, result_at_s: float | None) -> Finding:
    """Ack before result: a result first (or alone) is accepted, with a warning."""
    if result_at_s is not None and (ack_at_s is None or result_at_s < ack_at_s):
        return Finding(
            "warn",
            "the result came before the ack: Mailroom applies it (an ack is never needed for a "
            "result), but until an ack comes it republishes the request",
        )
    return Finding("pass", "ack before the result")


def outcome_of(response: RecognitionResponse, *, automatic_attempts: int) -> str:
    """What Mailroom does with an accepted result of attempt 1, for people."""
    if response.status == "processing":
        return "the job is processing"
    if response.status == "needs_check":
        return "its file waits for a person (never re-sent)"
    if response.status == "done":
        return "mapped: RECOGNIZED, or NEEDS_CHECK (never re-sent) if the document fails a check"
    klass = answer_error_class(response)
    code = response.error.code if response.error else SERVICE_ERROR
    if is_retried(klass, attempt=1, automatic_attempts=automatic_attempts):
        return f"{code} is {klass}: re-sent as a new attempt"
    return f"{code} is {klass}: the file ends ERROR, never re-sent"


#: ``{job_id}:{attempt}:ack`` or ``…:result``, the job and attempt taken out.
MSG_ID_PATTERN = re.compile(
    r"^(?P<job>[0-9a-f-]{36}):(?P<attempt>[0-9]+):(?P<kind>request|ack|result)$"
)


def status_of(data: bytes) -> object:
    """The ``status`` a message gives, read without the contract; None if it is not JSON."""
    try:
        return parse_json_object(data).get("status")
    except ValueError:
        return None


def job_named(msg_id: str | None, data: bytes) -> str | None:
    """The job a message is about, read without the contract: its msg id's, else its body's."""
    if msg_id:
        match = MSG_ID_PATTERN.match(msg_id)
        if match:
            return match["job"]
        head = msg_id.split(":", 1)[0]
        if head:
            return head
    try:
        job_id = parse_json_object(data).get("job_id")
    except ValueError:
        return None
    return str(job_id) if job_id is not None else None


@dataclass(frozen=True)
class Rule:
    """One rule of the exchange as the documentation states it."""

    topic: str
    text: str


def _rules() -> tuple[Rule, ...]:
    r = RecognitionSettings()
    return (
        Rule(
            "Schemas",
            "Every message is a JSON object (UTF-8, no byte-order mark) of its schema in "
            "`contracts/`: `recognition_request`, `recognition_response` (acks and results), "
            "and the result document `recognition_result`. Types are exact: `file_id` is a JSON "
            'integer, and a string (`"4182"`) breaks the contract; unknown fields are ignored. '
            f"A message over `max_message_bytes` ({r.max_message_bytes // 1024} KiB) is dropped "
            "unread.",
        ),
        Rule(
            "Versions",
            f"`schema_version` is `{CONTRACT_VERSION}` (absent: `1.0`). " + VERSION_POLICY,
        ),
        Rule(
            "Message ids",
            f"Every answer carries `{MSG_ID_HEADER}: {{job_id}}:{{attempt}}:ack` or `…:result`, "
            "the same for every copy. An answer without the header is accepted: Mailroom "
            "records it under the id it should have carried and logs a warning, and the checker "
            "warns (JetStream cannot drop repeats of a message without an id). An answer whose "
            "header names another job, attempt or kind is not applied (logged) and fails the "
            "checker: JetStream would drop an ack and a result under one id as duplicates.",
        ),
        Rule(
            "Order",
            "Ack first, then one result. A result that comes before its ack, or without one, is "
            "applied (a lost ack never blocks a result) and the checker warns: until an ack "
            f"comes Mailroom republishes the request every {r.ack_timeout_s:g} s.",
        ),
        Rule(
            "Accepted answers",
            "An answer naming a job Mailroom is waiting on, with that job's `file_id`, in time: "
            "`done` and `needs_check` with `result_s3` in the results bucket, or `error`. A "
            "repeat of an applied result, or a result after the job ended (`reply_deadline` "
            "passed, another answer applied), changes nothing.",
        ),
        Rule(
            "Answers that fail the job",
            "An answer or a result document that breaks the contract and names a waiting job "
            "ends it at once as `error` / `INVALID_RESULT` (`RESULT_FOREIGN_BUCKET`, "
            "`RESULT_TOO_LARGE`), its file `ERROR`; one that names no waiting job is only "
            "logged.",
        ),
        Rule(
            "Needs a check",
            "`needs_check`, and a `done` whose document misses a required field, has a field "
            "under `confidence_threshold` or an unknown `document_type`, settle the file as "
            "`NEEDS_CHECK`: it waits for a person (`mailroom review`) and is never re-sent to "
            "recognition. One job, one document.",
        ),
        Rule(
            "Retries",
            "Every error code is `retryable` or `permanent` (the table below). A service marks "
            "an error itself with `error.permanent` (`true`: permanent, `false`: retryable); "
            "without it the code's class applies, and a code not listed is retryable. A "
            f"retryable error, `TIMEOUT` included, is re-sent as a new job (new `job_id`, "
            f"`attempt + 1`) while `attempt < automatic_attempts` ({r.automatic_attempts} "
            "attempts in all); a permanent one never is, and its file ends `ERROR`.",
        ),
    )


#: Every rule, in the order the documentation gives them.
RULES = _rules()


def render_markdown() -> str:
    """The rules and the error codes, as the documentation shows them."""
    lines = [f"- **{rule.topic}.** {rule.text}" for rule in RULES]
    lines += ["", "| code | class | set by | meaning |", "| --- | --- | --- | --- |"]
    for who, codes in (("service", SERVICE_ERROR_CODES), ("Mailroom", MAILROOM_ERROR_CODES)):
        lines += [f"| `{e.code}` | {e.error_class} | {who} | {e.meaning} |" for e in codes]
    return "\n".join(lines) + "\n"


#: The page whose marked block :func:`render_markdown` writes.
DOCS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "pages" / "recognition-service.md"
_BLOCK = re.compile(r"(<!-- contract-rules:start -->\n)(.*?)(<!-- contract-rules:end -->)", re.S)


def with_rules(page: str) -> str:
    """``page`` with its rule book block rendered afresh."""
    return _BLOCK.sub(lambda m: m.group(1) + render_markdown() + m.group(3), page)


def write_docs(path: Path = DOCS_PAGE) -> Path:
    path.write_text(with_rules(path.read_text()))
    return path
