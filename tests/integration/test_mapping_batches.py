"""Mapping a batch of results: few statements, each job's outcome its own, nothing mapped twice."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError

from mailroom.adapters.storage import build_store
from mailroom.errors import ServiceUnavailable
from mailroom.recognition import attempts
from mailroom.recognition.mapping.run import map_recognition_results
from tests.integration.test_mapping_attempts import DownStore
from tests.integration.test_recognition_mapping import T0, Flow, invoice

pytestmark = pytest.mark.integration

# Postgres refuses a NUL character in jsonb: a document the database cannot store.
POISON = invoice(invoice_number={"value": "INV\u00007", "confidence": 0.99})


@pytest.fixture
def flow(db_sessions, recognition_factory, recognition_settings):
    return Flow(
        db_sessions, recognition_factory, build_store(recognition_settings), recognition_settings
    )


async def answered(flow, factory, results):
    refs = []
    for result in results:
        ref = await factory.create_job(status="processing")
        await flow.answer(ref, result=result)
        refs.append(ref)
    return refs


async def map_batch(flow, job_ids, store=None):
    return await map_recognition_results(
        flow.sessions,
        store or flow.store,
        job_ids,
        settings=flow.settings.recognition,
        now=T0,
    )


async def test_a_batch_maps_every_job_and_names_each_mail_it_made_final(flow, recognition_factory):
    refs = await answered(flow, recognition_factory, [invoice(), invoice(), invoice()])

    outcomes = await map_batch(flow, [r.job_id for r in refs])

    assert [o.job_id for o in outcomes] == [r.job_id for r in refs]
    assert [(o.applied, o.file_status) for o in outcomes] == [("mapped", "RECOGNIZED")] * 3
    assert [o.finalized_mail_ids for o in outcomes] == [[r.mail_id] for r in refs]
    documents = await recognition_factory.rows("SELECT id, job_id FROM document ORDER BY id")
    assert {d["job_id"]: d["id"] for d in documents} == {o.job_id: o.document_id for o in outcomes}
    for ref in refs:
        job = await recognition_factory.job(ref.job_id)
        assert job["mapped_at"] == T0
        assert "mapping_batch_attempts" not in job["metrics"], "the batch's attempt came back"


async def test_the_batch_write_gives_the_attempts_back_in_its_own_commit(
    flow, recognition_factory, monkeypatch
):
    refs = await answered(flow, recognition_factory, [invoice(), invoice()])
    separate: list[list] = []
    give_back = attempts.give_back

    async def recorded(sessions, job_ids, key):
        separate.append(list(job_ids))
        await give_back(sessions, job_ids, key)

    monkeypatch.setattr(attempts, "give_back", recorded)
    outcomes = await map_batch(flow, [r.job_id for r in refs])

    assert [o.applied for o in outcomes] == ["mapped", "mapped"]
    assert [ids for ids in separate if ids] == [], "no give-back of its own: one commit fewer"
    for ref in refs:
        assert (
            "mapping_batch_attempts" not in (await recognition_factory.job(ref.job_id))["metrics"]
        )


async def test_two_files_of_one_mail_in_one_batch_make_it_final_once(flow, recognition_factory):
    first = await recognition_factory.create_job(status="processing")
    second = await recognition_factory.create_job(status="processing", mail_id=first.mail_id)
    for ref in (first, second):
        await flow.answer(ref, result=invoice())

    outcomes = await map_batch(flow, [first.job_id, second.job_id])

    assert [o.finalized_mail_ids for o in outcomes] == [[first.mail_id], []]
    assert (await recognition_factory.mail(first.mail_id))["status"] == "final"


async def test_a_retried_batch_maps_nothing_twice(flow, recognition_factory):
    refs = await answered(flow, recognition_factory, [invoice(), invoice()])
    ids = [r.job_id for r in refs]

    first = await map_batch(flow, ids)
    again = await map_batch(flow, [*ids, ids[0]])

    assert [o.applied for o in first] == ["mapped", "mapped"]
    assert [o.applied for o in again] == ["already_mapped", "already_mapped"]
    assert len(await recognition_factory.rows("SELECT id FROM document")) == 2


async def test_a_job_the_database_refuses_fails_alone_and_its_neighbours_map(
    flow, recognition_factory
):
    good, poison, other = await answered(flow, recognition_factory, [invoice(), POISON, invoice()])

    outcomes = await map_batch(flow, [good.job_id, poison.job_id, other.job_id])

    assert [o.applied for o in outcomes] == ["mapped", "failed", "mapped"]
    assert isinstance(outcomes[1].error, DBAPIError)
    assert (await recognition_factory.file(good.file_id))["status"] == "RECOGNIZED"
    assert (await recognition_factory.file(other.file_id))["status"] == "RECOGNIZED"
    job = await recognition_factory.job(poison.job_id)
    assert job["mapped_at"] is None and "mapping_batch_attempts" not in job["metrics"]
    # Alone (as the actor sends it on), its error is raised for the actor's retries.
    with pytest.raises(DBAPIError):
        await map_batch(flow, [poison.job_id])
    assert "mapping_attempts" not in (await recognition_factory.job(poison.job_id))["metrics"]


async def test_after_a_batch_died_each_job_maps_alone_and_only_the_poison_runs_out(
    flow, recognition_factory, recognition_settings
):
    innocent, poison = await answered(flow, recognition_factory, [invoice(), invoice()])
    # A batch holding both died; then the poison's own attempts died up to the maximum.
    await attempts.count_attempts(
        flow.sessions, [innocent.job_id, poison.job_id], attempts.MAPPING_BATCH_ATTEMPTS
    )
    for _ in range(recognition_settings.recognition.max_processing_attempts):
        await attempts.count_attempts(flow.sessions, [poison.job_id], attempts.MAPPING_ATTEMPTS)

    outcomes = await map_batch(flow, [innocent.job_id, poison.job_id])

    assert [o.file_status for o in outcomes] == ["RECOGNIZED", "ERROR"]
    assert (await recognition_factory.job(poison.job_id))["error_code"] == (
        "MAPPING_ATTEMPTS_EXHAUSTED"
    )
    metrics = (await recognition_factory.job(innocent.job_id))["metrics"]
    assert "mapping_attempts" not in metrics, "its own attempt came back"


async def test_a_store_outage_fails_the_whole_batch_and_uses_no_attempts(flow, recognition_factory):
    refs = await answered(flow, recognition_factory, [invoice(), invoice()])
    ids = [r.job_id for r in refs]

    with pytest.raises(ServiceUnavailable):
        await map_batch(flow, ids, store=DownStore(flow.store))

    for ref in refs:
        job = await recognition_factory.job(ref.job_id)
        assert job["mapped_at"] is None
        assert not {"mapping_attempts", "mapping_batch_attempts"} & set(job["metrics"])
    assert [o.applied for o in await map_batch(flow, ids)] == ["mapped", "mapped"]
