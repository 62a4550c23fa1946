"""Log line formats: ``MAILROOM_LOG__FORMAT=json`` writes one JSON object per line.

Each object carries ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
``process`` (the Mailroom process name), ``pid``, ``exc_info`` when there is a
traceback, and whatever context filters add (a worker adds ``actor`` and
``message_id`` while it runs a message).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.json import JsonFormatter

#: Record attributes → JSON keys.
JSON_FIELDS = {
    "asctime": "time",
    "levelname": "level",
    "name": "logger",
    "message": "message",
    "process": "pid",
    "process_name": "process",
}


class CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of the record.

    Dramatiq's worker processes swap ``sys.stderr`` for the pipe their parent
    reads; a handler they inherit by fork then still writes into that pipe.
    """

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class ProcessName(logging.Filter):
    """Puts the Mailroom process name (``worker``, ``scheduler``…) on every record."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def filter(self, record: logging.LogRecord) -> bool:
        record.process_name = self.process
        return True


class JsonLogFormatter(JsonFormatter):
    """One JSON object per record; extra record attributes become keys."""

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s %(process)d",
            rename_fields=JSON_FIELDS,
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        # The scrubbing filter leaves the cleaned traceback in exc_text; the base
        # class would render exc_info afresh, secrets included.
        if record.exc_text:
            log_data["exc_info"] = record.exc_text
