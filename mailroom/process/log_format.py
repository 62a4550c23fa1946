"""Log line formats: ``MAILROOM_LOG__FORMAT=json`` writes one JSON object per line.

Each object carries ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
``process`` (the Mailroom process name), ``pid``, ``exc_info`` when there is a
traceback, and whatever context filters add (a worker adds ``actor`` and
``message_id`` while it runs a message).
"""

from __future__ import annotations

import logging
import os
import select
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


#: Set by ``mailroom.process.dramatiq_main`` before Dramatiq forks its worker processes, when its
#: main process writes their output to its own stderr (no ``--log-file``): the workers then
#: write their records to that stderr themselves (``CurrentStderrHandler``).
workers_write_stderr = False


class CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of the record.

    Dramatiq's worker processes swap ``sys.stderr`` for the pipe their parent
    reads, and the parent reads each line, decodes it and writes it again to its own
    stderr: measured at INFO in the delivery bench, about 50 µs of the worker tree's CPU
    per line (a "Delivered message" line per message), a fifth of its work. When
    ``workers_write_stderr`` is set, a worker process writes a record in one
    ``write`` to the stderr it inherited (``fd``, where the parent would have written it)
    instead. Lines of several processes stay whole: one write of at most ``PIPE_BUF``
    bytes goes into a pipe whole, and appends to a file do not mix; a longer record (a long
    traceback) goes through the parent's pipe.
    """

    #: The inherited stderr a worker process writes to.
    fd = 2

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        if not workers_write_stderr or sys.stderr is sys.__stderr__:
            super().emit(record)  # not a Dramatiq worker process: sys.stderr is the real one
            return
        try:
            text = self.format(record) + self.terminator
            data = text.encode("utf-8", errors="replace")
            if len(data) > select.PIPE_BUF:
                sys.stderr.write(text)
                return
            while data:
                data = data[os.write(self.fd, data) :]
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


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
