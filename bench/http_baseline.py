"""Helpers of ``bench/delivery.py``, each run as its own process so neither shares a GIL.

* ``sink PORT SECRET``: a webhook sink that verifies every signature as the dev sink
  does (``mailroom.webhooks.verify``) and answers 200, over HTTP/1.1 keep-alive,
  until SIGTERM;
* ``posts URL SECRET COUNT CONCURRENCY``: the raw baseline, aiohttp POSTs of the bodies
  the webhook channel sends (same JSON, same signature headers) at a concurrency, through
  the channel's own session (``client_session``: its timeouts, as many connections);
  prints the rate in POSTs per second and the process's CPU seconds over the POSTs.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: str) -> None:
    """HTTP/1.1 with keep-alive: verify each POST's signature and JSON, answer 200 (or 401)."""
    from mailroom import webhooks

    try:
        while head := await reader.readuntil(b"\r\n\r\n"):
            lines = head.decode("latin-1").split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            lowered = {k.lower(): v for k, v in headers.items()}
            body = await reader.readexactly(int(lowered.get("content-length", "0")))
            try:
                webhooks.verify(headers, body, secrets=[secret])
                json.loads(body)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            except (webhooks.WebhookVerificationError, ValueError):
                writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


class SinkProcess:
    """The sink in a process of its own on a free port, for the benchmarks in this folder.

    ``env`` is the settings that make it the ``default`` webhook account (allowed over
    plain HTTP on loopback)."""

    def __init__(self) -> None:
        from mailroom.devtools.children import spawn
        from mailroom.devtools.sinks import new_secret
        from mailroom.devtools.stack import free_port

        port, self.secret = free_port(), new_secret()
        self.url = f"http://127.0.0.1:{port}/hook"
        self.process = spawn(
            [sys.executable, str(Path(__file__).resolve()), "sink", str(port), self.secret],
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == b"ready"
        self.env = {
            "MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS": json.dumps(
                {"default": {"url": self.url, "secrets": [self.secret]}}
            ),
            "MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS": json.dumps(["127.0.0.1"]),
            "MAILROOM_DELIVERY__WEBHOOK_ALLOW_HTTP": "true",
        }

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def run_sink(port: int, secret: str) -> None:
    """A small asyncio sink: the stdlib dev sink (a thread and a connection per request)
    cannot take hundreds of senders at once, and would be what is measured."""

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        server = await asyncio.start_server(
            lambda r, w: _serve(r, w, secret), "127.0.0.1", port, backlog=1024
        )
        print("ready", flush=True)
        async with server:
            await stop.wait()

    asyncio.run(main())


async def posts(url: str, secret: str, count: int, concurrency: int) -> tuple[float, float]:
    import aiohttp

    from mailroom import webhooks
    from mailroom.adapters.channels.webhook import client_session
    from mailroom.settings import WebhookAccount

    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(1, count + 1):
        queue.put_nowait(n)

    async def post_all(session: aiohttp.ClientSession) -> None:
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
            async with session.post(
                url, data=body, headers=headers, allow_redirects=False
            ) as response:
                await response.read()
                response.raise_for_status()

    # The webhook channel's own session (one per account and process), its connections
    # capped at the concurrency.
    account = WebhookAccount(url=url, max_in_flight=concurrency)
    async with client_session(account) as session:
        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(post_all(session) for _ in range(concurrency)))
        return count / (time.perf_counter() - started), time.process_time() - cpu


if __name__ == "__main__":
    if sys.argv[1] == "sink":
        run_sink(int(sys.argv[2]), sys.argv[3])
    else:
        url, secret, count, concurrency = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
        # The collector as the deliverer's worker has it (`mailroom worker`): like with like.
        from mailroom.process import gc_policy

        gc_policy.tune()
        rate, cpu_s = asyncio.run(posts(url, secret, int(count), int(concurrency)))
        print(f"{rate:.1f} {cpu_s:.4f}")
