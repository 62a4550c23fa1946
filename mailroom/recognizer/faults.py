"""Faults the reference recognizer can be told to have, so tests can see the exchange cope.

Switched on with ``MAILROOM_RECOGNIZER__FAULTS`` (for example
``drop_acks,fail_with=OCR_FAILED``) and ``MAILROOM_RECOGNIZER__DELAY_S``; the
default is a well-behaved service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mailroom.settings import RecognizerSettings


@dataclass(frozen=True)
class RecognizerFaults:
    """Misbehaviour switched on for tests; the default is a well-behaved service."""

    #: Never send acks (results still go out).
    drop_acks: bool = False
    #: Wait this long after the ack before answering, in seconds.
    delay_s: float = 0.0
    #: Publish every result twice (same ``Nats-Msg-Id``).
    duplicate_results: bool = False
    #: Answer every request with an ``error`` result carrying this code.
    fail_with: str | None = None
    #: Work out results but never publish them.
    drop_results: bool = False

    @classmethod
    def parse(cls, spec: str, *, delay_s: float = 0.0) -> RecognizerFaults:
        """Faults from ``drop_acks,duplicate_results,drop_results,fail_with=CODE``.

        Raises:
            ValueError: on an unknown fault name.
        """
        flags: dict[str, Any] = {"delay_s": delay_s}
        for token in (t.strip() for t in spec.split(",")):
            name, _, value = token.partition("=")
            name = name.strip().lower()
            if not name:
                continue
            if name in ("drop_acks", "duplicate_results", "drop_results") and not value:
                flags[name] = True
            elif name == "fail_with" and value.strip():
                flags["fail_with"] = value.strip()[:100]
            elif name == "delay_s" and value.strip():
                flags["delay_s"] = float(value)
            else:
                raise ValueError(f"unknown recognizer fault {token[:50]!r}")
        return cls(**flags)

    @classmethod
    def from_settings(cls, settings: RecognizerSettings) -> RecognizerFaults:
        return cls.parse(settings.faults, delay_s=settings.delay_s)
