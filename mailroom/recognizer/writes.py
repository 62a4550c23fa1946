"""The reference recognizer's result documents, written together.

Each job waits until its own document is stored before it publishes the result (the
contract); the documents of the jobs that finish in the same turn of the event loop go
to the store in one ``put_many``. On a filesystem store that is one thread hop and one
round of syncs (the files and their folder) for all of them instead of one per job.
"""

from __future__ import annotations

import asyncio

from mailroom.adapters.storage import ObjectStore, PutOutcome, PutRequest, StoredRef

#: Media type of a result document.
RESULT_MEDIA_TYPE = "application/json"


class ResultWrites:
    """``put`` one result document; the ones of one loop turn share a ``put_many``."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._waiting: list[tuple[PutRequest, asyncio.Future[StoredRef]]] = []

    async def put(self, key: str, body: bytes) -> StoredRef:
        """Store ``body`` under ``key`` in the results bucket; the store's error if it failed."""
        stored: asyncio.Future[StoredRef] = asyncio.get_running_loop().create_future()
        if not self._waiting:
            # Begun on the loop's next turn, so the documents of this turn join it.
            asyncio.get_running_loop().call_soon(self._begin)
        self._waiting.append((PutRequest("results", key, body, RESULT_MEDIA_TYPE), stored))
        return await stored

    def _begin(self) -> None:
        batch, self._waiting = self._waiting, []
        task = asyncio.ensure_future(self._write(batch))
        # Each waiter gets its own outcome; nothing else is left to retrieve.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def _write(self, batch: list[tuple[PutRequest, asyncio.Future[StoredRef]]]) -> None:
        try:
            outcomes: list[PutOutcome] = await self.store.put_many([r for r, _ in batch])
        except Exception as exc:
            outcomes = [exc] * len(batch)
        for (_, stored), outcome in zip(batch, outcomes, strict=True):
            if stored.done():  # its job was cancelled (stop timed out)
                continue
            if isinstance(outcome, Exception):
                stored.set_exception(outcome)
            else:
                stored.set_result(outcome)
