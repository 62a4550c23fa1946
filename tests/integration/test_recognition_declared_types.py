"""Declared file types: a request of a type no service declares is not sent; its file waits."""

from __future__ import annotations

import pytest

from mailroom.adapters.nats import InMemoryPublisher
from mailroom.db.models import PIPELINES
from mailroom.recognition.outbox.declared import Undeclared, undeclared_waiting
from mailroom.recognition.outbox.relay import publish_recognition_requests
from mailroom.settings import RecognitionSettings
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

#: A CSV-only service: the image pipeline declares nothing.
CSV_ONLY = RecognitionSettings(file_types={"tabular": ["csv"]})


async def _pass(sessions, publisher, settings, recognition):
    return await publish_recognition_requests(
        sessions, publisher, nats=settings.nats, recognition=recognition, now=at("12:00:00")
    )


async def test_only_declared_types_are_sent_and_the_others_wait_queued(
    db_sessions, recognition_factory, recognition_settings
):
    csv = await recognition_factory.create_job(file_type="csv")
    xlsx = await recognition_factory.create_job(original_name="a.xlsx", file_type="xlsx")
    png = await recognition_factory.create_job(
        pipeline="image", original_name="scan.png", file_type="png"
    )
    publisher = InMemoryPublisher()

    outcome = await _pass(db_sessions, publisher, recognition_settings, CSV_ONLY)

    assert outcome.published == [csv.job_id]
    for waiting in (xlsx, png):
        job = await recognition_factory.job(waiting.job_id)
        assert job["status"] == "queued" and job["reply_deadline"] is None
    async with db_sessions() as session:
        assert await undeclared_waiting(session, CSV_ONLY, PIPELINES) == [
            Undeclared("image", "png", 1),
            Undeclared("tabular", "xlsx", 1),
        ]

    # Once the type is declared the waiting file is sent.
    both = RecognitionSettings(file_types={"tabular": ["csv", "XLSX"], "image": ["*"]})
    outcome = await _pass(db_sessions, publisher, recognition_settings, both)

    assert sorted(outcome.published) == sorted([xlsx.job_id, png.job_id])
    async with db_sessions() as session:
        assert await undeclared_waiting(session, both, PIPELINES) == []


async def test_every_type_is_declared_by_default(
    db_sessions, recognition_factory, recognition_settings
):
    odd = await recognition_factory.create_job(original_name="notes.txt", file_type="txt")

    outcome = await _pass(
        db_sessions, InMemoryPublisher(), recognition_settings, RecognitionSettings()
    )

    assert outcome.published == [odd.job_id]
