"""Mapping counts its attempts in Postgres: a result that kills its worker still ends."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.exc import DBAPIError

from mailroom.adapters.storage import build_store
from mailroom.errors import ServiceUnavailable
from mailroom.recognition import attempts
from mailroom.recognition.mapping.run import map_recognition_result
from tests.integration.test_recognition_mapping import T0, Flow, invoice

pytestmark = pytest.mark.integration


@pytest.fixture
def flow(db_sessions, recognition_factory, recognition_settings):
    return Flow(
        db_sessions, recognition_factory, build_store(recognition_settings), recognition_settings
    )


async def died(flow, job_id, times):
    """Attempts that counted themselves and never came back, as a killed worker leaves them."""
    for _ in range(times):
        await attempts.count_attempts(flow.sessions, [job_id], attempts.MAPPING_ATTEMPTS)


async def test_a_result_whose_mapping_keeps_killing_the_worker_settles_as_error(
    flow, recognition_factory, recognition_settings
):
    ref = await recognition_factory.create_job(status="processing")
    await flow.answer(ref, result=invoice())
    await died(flow, ref.job_id, recognition_settings.recognition.max_processing_attempts)

    outcome = await flow.map(ref.job_id)

    assert (outcome.applied, outcome.file_status, outcome.replayed) == ("mapped", "ERROR", None)
    job = await recognition_factory.job(ref.job_id)
    assert job["error_code"] == "MAPPING_ATTEMPTS_EXHAUSTED"
    assert job["mapped_at"] == T0
    file = await recognition_factory.file(ref.file_id)
    assert file["status_reason"].startswith("MAPPING_ATTEMPTS_EXHAUSTED:")
    assert outcome.finalized_mail_id == ref.mail_id
    assert await recognition_factory.rows("SELECT id FROM document") == []
    deaths = recognition_settings.recognition.max_processing_attempts
    assert job["metrics"]["mapping_attempts"] == deaths, "the settling attempt is not counted"


async def test_attempts_below_the_maximum_still_map(
    flow, recognition_factory, recognition_settings
):
    ref = await recognition_factory.create_job(status="processing")
    await flow.answer(ref, result=invoice())
    await died(flow, ref.job_id, recognition_settings.recognition.max_processing_attempts - 1)

    outcome = await flow.map(ref.job_id)

    assert outcome.file_status == "RECOGNIZED"
    job = await recognition_factory.job(ref.job_id)
    # The attempt that came back is uncounted: what stays is the attempts that died.
    deaths = recognition_settings.recognition.max_processing_attempts - 1
    assert job["metrics"]["mapping_attempts"] == deaths


async def test_a_mapping_nothing_died_on_leaves_no_count(flow, recognition_factory):
    ref = await recognition_factory.create_job(status="processing")
    await flow.answer(ref, result=invoice())

    assert (await flow.map(ref.job_id)).file_status == "RECOGNIZED"

    assert "mapping_attempts" not in (await recognition_factory.job(ref.job_id))["metrics"]


class DownStore:
    """An object store that is down: each read raises, as an outage does."""

    def __init__(self, store):
        self.store = store

    def bucket(self, role):
        return self.store.bucket(role)

    async def size(self, bucket, key):
        raise ServiceUnavailable("storage down")

    async def get(self, bucket, key):
        raise AssertionError("not reached")


async def test_attempts_that_raise_are_given_back_so_an_outage_uses_none_up(
    flow, recognition_factory, recognition_settings
):
    ref = await recognition_factory.create_job(status="processing")
    await flow.answer(ref, result=invoice())
    down = DownStore(flow.store)

    for _ in range(recognition_settings.recognition.max_processing_attempts + 2):
        with pytest.raises(ServiceUnavailable):
            await map_recognition_result(
                flow.sessions, down, ref.job_id, settings=recognition_settings.recognition, now=T0
            )

    assert "mapping_attempts" not in (await recognition_factory.job(ref.job_id))["metrics"]
    assert (await flow.map(ref.job_id)).file_status == "RECOGNIZED"


async def test_suspect_attempts_run_one_at_a_time(db_sessions):
    # Suspects (an earlier attempt died) never share a death: one runs, the next waits its turn.
    entered, release = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with attempts.alone(db_sessions, attempts.ALONE_KEY):
            entered.set()
            await release.wait()

    holder = asyncio.create_task(first())
    await entered.wait()
    with pytest.raises(DBAPIError):  # the lock timeout: the actor retries it later
        async with attempts.alone(db_sessions, attempts.ALONE_KEY, wait_s=0.2):
            pass
    release.set()
    await holder
    async with attempts.alone(db_sessions, attempts.ALONE_KEY, wait_s=0.2):
        pass
