"""Receivers for ``mailroom dev`` and end-to-end tests: a webhook sink and an SMTP sink.

Both record what arrives (deduping webhook deliveries on ``Idempotency-Key``,
as a real receiver would) and call ``on_receive`` with a one-line summary, so
``mailroom dev`` can print notifications as they land. The webhook sink holds a
signing secret of its own and verifies every request with ``mailroom.webhooks``.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from secrets import token_bytes
from typing import Any

from aiosmtpd.controller import Controller

from mailroom import webhooks
from mailroom.devtools.stack import free_port

Announce = Callable[[str], None]


@dataclass
class Received:
    key: str
    recipient: str
    subject: str
    body: str
    duplicate: bool = False


@dataclass
class _Record:
    items: list[Received] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, item: Received) -> Received:
        with self.lock:
            item.duplicate = item.key in self.keys
            self.keys.add(item.key)
            self.items.append(item)
        return item

    def unique(self) -> list[Received]:
        with self.lock:
            return [item for item in self.items if not item.duplicate]

    def per_key(self) -> Counter[str]:
        with self.lock:
            return Counter(item.key for item in self.items)


def new_secret() -> str:
    """A random signing secret in the Standard Webhooks format."""
    return webhooks.SECRET_PREFIX + base64.b64encode(token_bytes(32)).decode()


#: How long the sink keeps an idle connection open, in seconds: longer than httpx keeps
#: one in its pool (5 s), so the sender, not the sink, closes it.
KEEP_ALIVE_S = 30.0


class _SinkServer(ThreadingHTTPServer):
    #: Listen backlog: 2 worker processes x 8 threads x a batch's lanes connect at once.
    request_queue_size = 256
    #: ``stop`` does not wait for kept-alive connections: their threads end when they close.
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A sender that goes away with its kept-alive connection (a worker stopped or killed)
        # resets it: that is the end of the connection, not a failure worth a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class WebhookSink:
    """An HTTP server that accepts every signed JSON POST with 200 and records it.

    ``secrets`` verify each request (``mailroom.webhooks.verify``): a missing, stale or
    forged signature is answered 401 with the reason and kept in ``rejected``; by
    default the sink makes up a secret of its own (``account`` hands it to the sender).
    ``delay_s`` holds each answer that long after the POST was recorded, as a slow
    receiver would (fault tests: sends still in flight when something dies). ``clock``
    is the receiver's clock (tests: a request that arrives long after it was signed).
    """

    def __init__(
        self,
        *,
        port: int = 0,
        on_receive: Announce | None = None,
        delay_s: float = 0.0,
        secrets: list[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.port = port or free_port()
        self.delay_s = delay_s
        self.secrets = [new_secret()] if secrets is None else secrets
        self.record = _Record()
        #: Why each refused request was refused, in arrival order.
        self.rejected: list[str] = []
        #: Connections senders opened to the sink.
        self.connections = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            # Keep-alive, as real receivers answer: a connection per POST cost the sender a
            # connect and a teardown each, and bursts of connects overflowed the listen queue.
            protocol_version = "HTTP/1.1"
            timeout = KEEP_ALIVE_S

            def setup(self) -> None:
                super().setup()
                with sink.record.lock:
                    sink.connections += 1

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    webhooks.verify(
                        dict(self.headers.items()), raw, secrets=sink.secrets, now=clock()
                    )
                except webhooks.WebhookVerificationError as exc:
                    with sink.record.lock:
                        sink.rejected.append(str(exc))
                    self.send_response(401, str(exc))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                try:
                    payload: dict[str, Any] = json.loads(raw)
                except ValueError:
                    self.send_response(400)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                item = sink.record.add(
                    Received(
                        key=self.headers.get("Idempotency-Key") or "",
                        recipient=str(payload.get("recipient", "")),
                        subject=str(payload.get("subject") or ""),
                        body=str(payload.get("body", "")),
                    )
                )
                if sink.delay_s:
                    time.sleep(sink.delay_s)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                if on_receive is not None and not item.duplicate:
                    on_receive(f"webhook → {item.recipient}: {item.subject}")

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: on_receive says what matters

        self._server = _SinkServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def account(self) -> dict[str, Any]:
        """The webhook account (``delivery.webhook_accounts`` item) that posts to this sink."""
        return {"url": self.url, "secrets": list(self.secrets)}

    @property
    def received(self) -> list[Received]:
        return self.record.unique()

    def posts_per_key(self) -> Counter[str]:
        """How many POSTs arrived per ``Idempotency-Key``; above 1, the sender re-sent it."""
        return self.record.per_key()

    def start(self) -> WebhookSink:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _SmtpHandler:
    def __init__(self, record: _Record, on_receive: Announce | None) -> None:
        self.record = record
        self.on_receive = on_receive

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        from email import message_from_bytes, policy

        message = message_from_bytes(envelope.content, policy=policy.default)
        plain = message.get_body(("plain",))
        item = self.record.add(
            Received(
                key=str(message.get("Message-ID", "")),
                recipient=", ".join(envelope.rcpt_tos),
                subject=str(message.get("Subject", "")),
                body=plain.get_content() if plain is not None else "",
            )
        )
        if self.on_receive is not None and not item.duplicate:
            self.on_receive(f"e-mail → {item.recipient}: {item.subject}")
        return "250 Message accepted for delivery"


class SmtpSink:
    """aiosmtpd on loopback that accepts every mail and records it."""

    def __init__(self, *, port: int = 0, on_receive: Announce | None = None) -> None:
        self.port = port or free_port()
        self.record = _Record()
        self._controller = Controller(
            _SmtpHandler(self.record, on_receive), hostname="127.0.0.1", port=self.port
        )

    @property
    def received(self) -> list[Received]:
        return self.record.unique()

    def start(self) -> SmtpSink:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()
