"""The file types the recognition services declare (``recognition.file_types``).

The declaration is configuration, not something services announce at runtime: the operator
pairs Mailroom with its services anyway (subjects, buckets, NATS users), reviews it with the
deployment, and a restarting service does not make its files flap between sent and held (the
health gate covers a service that is down). A queued job whose file type its pipeline does not
declare is not sent: it waits ``queued``, with no deadline running, and ``mailroom status``
counts it by pipeline and type, until the type is declared.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.settings import RecognitionSettings

# The current jobs waiting queued whose type their pipeline does not declare.
_UNDECLARED = text(
    """
    SELECT j.pipeline, f.file_type, count(*) AS files
      FROM recognition_job AS j
      JOIN stored_file AS f ON f.current_recognition_job_id = j.id
      JOIN unnest(CAST(:pipelines AS text[]), CAST(:types AS text[])) AS p(pipeline, types)
        ON p.pipeline = j.pipeline
     WHERE j.status = 'queued'
       AND p.types IS NOT NULL
       AND f.file_type <> ALL(string_to_array(p.types, ','))
     GROUP BY j.pipeline, f.file_type
     ORDER BY j.pipeline, f.file_type
    """
)


@dataclass(frozen=True)
class Undeclared:
    """Files of one pipeline and type that wait for a service declaring the type."""

    pipeline: str
    file_type: str
    files: int


def declared_types_param(
    recognition: RecognitionSettings, pipelines: Iterable[str]
) -> list[str | None]:
    """Per pipeline, its declared types as a comma list; None when every type is."""
    params: list[str | None] = []
    for pipeline in pipelines:
        types = recognition.declared_types(pipeline)
        params.append(None if types is None else ",".join(types))
    return params


async def undeclared_waiting(
    session: AsyncSession, recognition: RecognitionSettings, pipelines: Iterable[str]
) -> list[Undeclared]:
    """The files waiting because no service declares their type, by pipeline and type."""
    pipelines = list(pipelines)
    if all(recognition.declared_types(p) is None for p in pipelines):
        return []
    rows = await session.execute(
        _UNDECLARED,
        {"pipelines": pipelines, "types": declared_types_param(recognition, pipelines)},
    )
    return [Undeclared(pipeline, file_type, files) for pipeline, file_type, files in rows.all()]
