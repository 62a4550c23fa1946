"""Settings of the recognition exchange and of the reference recognizer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mailroom.document_types import DocumentType
from mailroom.settings.base import (
    StrictModel,
)

#: In ``file_types``: every file type of the pipeline.
ANY_TYPE = "*"
PipelineName = Literal["tabular", "image"]


def _every_type() -> dict[PipelineName, list[str]]:
    return {"tabular": [ANY_TYPE], "image": [ANY_TYPE]}


class RecognitionSettings(StrictModel):
    #: A published job with no ack for this long is republished, in seconds.
    ack_timeout_s: float = 30.0
    #: How long a recognition service has to answer, in seconds.
    reply_deadline_s: float = 300.0
    max_republish: int = 3
    publish_batch_size: int = 500
    #: Flow control: at most this many requests of one pipeline published and not yet acked or
    #: answered; other jobs wait ``queued`` (their deadline and no-ack clock start at publish).
    #: It must cover the service's rate x the round trip from publish to the applied ack (the
    #: service's queue, the bridge, the inbox's queue): bench/e2e.py without a window had
    #: 120-250 requests unacked at 50-80 acks/s, about 3 s (a window of 200 stood full most of
    #: a drain). A request waits about this many / the rate for its ack: 500 is 5-10 s at the
    #: reference recognizer's 50-100 answers/s, a third of ack_timeout_s at most. For a service
    #: slower than about 17/s (500 / ack_timeout_s), use its rate x 10 s.
    max_unacked_per_pipeline: int = Field(default=500, gt=0)
    #: Attempts in all (the first included) at a file whose attempt failed with a retryable
    #: error or TIMEOUT; a permanent error, or a file that needs a check, settles at once.
    automatic_attempts: int = 2
    confidence_threshold: float = 0.8
    #: Per type, the fields its documents need; a list inside ``required`` means one of them:
    #: ``{"fund": {"required": [["investor_name", "customer_id"], "amount"]}}``.
    document_types: dict[str, DocumentType] = Field(
        default_factory=lambda: {
            "invoice": DocumentType(required=["invoice_number", "total"]),
            "generic": DocumentType(),
        }
    )
    #: Results unmapped for this long are re-sent to mapping by the sweep, in seconds.
    unmapped_after_s: float = 60.0
    #: Jobs one unmapped-result sweep re-sends at most.
    sweep_batch_size: int = 500
    #: Jobs one watchdog transaction times out at most; a pass loops over batches, in jobs.
    watchdog_batch_size: int = 500
    #: Inbox messages larger than this are rejected unread, in bytes.
    max_message_bytes: int = 256 * 1024
    #: Result files larger than this are not mapped, in bytes.
    max_result_bytes: int = 16 * 1024 * 1024
    #: Tries of the inbox or of mapping at one job whose worker died (never came back),
    #: counted in Postgres; past them the job fails (`*_ATTEMPTS_EXHAUSTED`).
    max_processing_attempts: int = 5
    #: Health gate: when no service of a pipeline answered (ack or result) for this long while
    #: one of its requests has waited as long unacked, the outbox and the watchdog hold its jobs
    #: (no republish counted, no ``dlq``, no timeout) until a service answers, in seconds. Keep
    #: it under ack_timeout_s x (max_republish + 1), or jobs are dead-lettered before it closes.
    silence_after_s: float = Field(default=60.0, gt=0)
    #: The file types the recognition services handle, per pipeline (intake's names: csv,
    #: tsv, xlsx, xls, txt; pdf, png, jpeg, tiff); ``*`` is every type. A file of a type its
    #: pipeline does not list is not sent: its job waits ``queued``, counted by ``mailroom
    #: status``, until the type is added here. A pipeline left out lists nothing.
    file_types: dict[PipelineName, list[str]] = Field(default_factory=_every_type)

    def declared_types(self, pipeline: str) -> list[str] | None:
        """The file types declared for ``pipeline``; None when every type is."""
        types = self.file_types.get(pipeline, [])  # type: ignore[call-overload]
        return None if ANY_TYPE in types else [t.lower().lstrip(".") for t in types]


class RecognizerSettings(StrictModel):
    """The reference recognizer (``mailroom recognizer``), with switchable faults for tests."""

    #: Comma-separated faults: drop_acks, duplicate_results, drop_results, fail_with=CODE.
    faults: str = ""
    #: Extra wait before each answer, in seconds.
    delay_s: float = 0.0
    service_name: str = "mailroom-reference-recognizer"
    #: Run even beside a mailbox marked ``real`` (its extraction is not fit for real mail);
    #: ``mailroom dev`` sets it for its own stack.
    allow_real_mailboxes: bool = False
