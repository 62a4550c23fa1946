"""Helpers of ``bench/delivery.py``, each run as its own process so neither shares a GIL.

* ``sink PORT SECRET``: the dev webhook sink (verifies every signature, answers 200)
  until SIGTERM;
* ``posts URL SECRET COUNT CONCURRENCY``: the raw baseline, httpx POSTs of the bodies
  the webhook channel sends (same JSON, same signature headers) at a concurrency;
  prints the rate in POSTs per second.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_sink(port: int, secret: str) -> None:
    from mailroom.devtools.sinks import WebhookSink

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sink = WebhookSink(port=port, secrets=[secret]).start()
    print("ready", flush=True)
    stop.wait()
    sink.stop()


async def posts(url: str, secret: str, count: int, concurrency: int) -> float:
    import httpx

    from mailroom import webhooks

    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(1, count + 1):
        queue.put_nowait(n)

    async def post_all(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            n = queue.get_nowait()
            body = json.dumps(
                {
                    "message_id": n,
                    "chunk": 1,
                    "chunks": 1,
                    "recipient": "bench",
                    "subject": None,
                    "body": f"hello {n}",
                },
                separators=(",", ":"),
            ).encode()
            key = f"raw-{n}"
            headers = {"Content-Type": "application/json", "Idempotency-Key": key}
            headers |= webhooks.signature_headers([secret], key, body)
            response = await client.post(url, content=body, headers=headers)
            response.raise_for_status()

    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        started = time.perf_counter()
        await asyncio.gather(*(post_all(client) for _ in range(concurrency)))
        return count / (time.perf_counter() - started)


if __name__ == "__main__":
    if sys.argv[1] == "sink":
        run_sink(int(sys.argv[2]), sys.argv[3])
    else:
        url, secret, count, concurrency = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
        print(f"{asyncio.run(posts(url, secret, int(count), int(concurrency))):.1f}")
