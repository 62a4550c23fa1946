"""A batch's arrays as one text parameter each, for ``CAST(:ids AS uuid[])`` and the like.

psycopg dumps a Python list element by element with a dumper looked up for each;
for the hundreds of ids and message ids of an outbox pass or an inbox batch that
costs more CPU than the statement. An array literal in one string costs a join.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable


def uuid_array(ids: Iterable[uuid.UUID | str]) -> str:
    """A ``uuid[]`` literal: ``{…,…}`` (uuids, or their text, need no quoting)."""
    return "{" + ",".join(str(value) for value in ids) + "}"


def int_array(values: Iterable[int]) -> str:
    """A ``bigint[]`` literal."""
    return "{" + ",".join(str(int(value)) for value in values) + "}"


def text_array(values: Iterable[str]) -> str:
    """A ``text[]`` literal, every element quoted, so any text (commas, quotes, braces) is kept."""
    return "{" + ",".join(_quoted(value) for value in values) + "}"


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
