"""The reference recognizer's result documents: stored together, each job told its own outcome."""

from __future__ import annotations

import asyncio

import pytest

from mailroom.adapters.storage import build_store
from mailroom.errors import StorageUnavailable
from mailroom.recognizer.writes import ResultWrites
from mailroom.settings import Settings, StorageSettings

pytestmark = pytest.mark.integration


class CountingStore:
    """The filesystem store, counting its ``put_many`` calls (and failing them on demand)."""

    def __init__(self, tmp_path) -> None:
        self.store = build_store(Settings(state_dir=tmp_path, storage=StorageSettings()))
        self.batches: list[int] = []
        self.down = False

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def put_many(self, requests):
        self.batches.append(len(requests))
        if self.down:
            raise StorageUnavailable("store down")
        return await self.store.put_many(requests)


async def test_documents_of_one_turn_are_stored_in_one_batch_and_each_job_gets_its_ref(tmp_path):
    store = CountingStore(tmp_path)
    writes = ResultWrites(store)
    refs = await asyncio.gather(
        *(writes.put(f"results/{n}.1.json", b'{"n": %d}' % n) for n in range(5))
    )
    later = await writes.put("results/9.1.json", b"{}")

    assert store.batches == [5, 1]
    assert [ref.key for ref in refs] == [f"results/{n}.1.json" for n in range(5)]
    assert await store.get(later.bucket, later.key) == b"{}"
    assert await store.get(refs[3].bucket, refs[3].key) == b'{"n": 3}'


async def test_a_failed_batch_fails_every_job_in_it(tmp_path):
    store = CountingStore(tmp_path)
    store.down = True
    writes = ResultWrites(store)
    outcomes = await asyncio.gather(
        writes.put("results/a.1.json", b"{}"),
        writes.put("results/b.1.json", b"{}"),
        return_exceptions=True,
    )
    assert [type(o) for o in outcomes] == [StorageUnavailable, StorageUnavailable]
    store.down = False
    assert (await writes.put("results/a.1.json", b"{}")).key == "results/a.1.json"
