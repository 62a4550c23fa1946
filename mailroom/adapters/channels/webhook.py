"""The ``webhook`` channel: HTTP POST of JSON with an ``Idempotency-Key`` per chunk.

Requests are signed by the Standard Webhooks convention (``mailroom.webhooks``) when
the account has secrets; ``webhook-id`` is the idempotency key, so a resend carries
the same id and a fresh timestamp and signature.

Before each send the URL is checked against the allow-list (``mailroom.outbound``),
the host resolved and every address checked; the request then goes to the checked
address (the name stays in ``Host`` and in TLS), so a DNS answer that changes
between the check and the connect cannot redirect it.

2xx is delivered; 429 with ``Retry-After`` is a rate limit; 5xx, timeouts and
connection errors are retryable; any other status is permanent. The receiver
dedupes on the key, so the channel is idempotent and a send left uncertain by a
crash is simply sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from mailroom import outbound, webhooks
from mailroom.adapters.channels import Capabilities, register
from mailroom.delivery.ports import Envelope
from mailroom.errors import ChannelRejected, ChannelUnavailable, RateLimited, UnknownAccount
from mailroom.settings import DeliverySettings, WebhookAccount

#: Longest wait for the DNS answer of a webhook host, in seconds.
RESOLVE_TIMEOUT_S = 10.0

#: Longest provider id kept per chunk, in characters.
MAX_ID_CHARS = 200

#: Largest JSON answer read for an id, in bytes.
MAX_ID_BODY_BYTES = 64 * 1024

#: Longest wait a ``Retry-After`` header may ask for, in seconds.
MAX_RETRY_AFTER_S = 3600.0

#: Connections of one pooled httpx client. httpcore checks every connection of its pool
#: (expiry, a readability poll of its socket) each time a request starts or ends, so a
#: request's CPU grows with the pool: measured here, about 1 ms per POST with 8 connections,
#: 2 ms with 16, 3.7 ms with 100 (httpx's default). An account's requests in flight are
#: spread over clients of at most this many connections instead.
CONNECTIONS_PER_CLIENT = 8


@register("webhook", Capabilities(idempotent=True))
class WebhookChannel:
    """POSTs each chunk to the account's URL over one pooled HTTP client."""

    def __init__(self, account: str, settings: DeliverySettings) -> None:
        found = settings.webhook_accounts.get(account)
        if found is None:
            raise UnknownAccount(f"no webhook account {account[:50]!r}")
        self.account_name = account
        self.account: WebhookAccount = found
        self.allow = settings.webhook_allow_list
        self._pool = ClientPool(found.max_in_flight, timeout_s=found.timeout_s)

    async def send(self, envelope: Envelope) -> str | None:
        body = json.dumps(
            {
                "message_id": envelope.message_id,
                "chunk": envelope.chunk,
                "chunks": envelope.chunks,
                "recipient": envelope.recipient,
                "subject": envelope.subject,
                "body": envelope.body,
            },
            separators=(",", ":"),
        ).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": envelope.idempotency_key}
        if self.account.secrets:
            secrets = [secret.get_secret_value() for secret in self.account.secrets]
            headers |= webhooks.signature_headers(secrets, envelope.idempotency_key, body)
        for name, value in headers.items():
            outbound.check_header_value(name, value)
        targets = await self._pinned_targets(headers)
        async with self._pool.client() as client:
            response = await _post_first_reachable(client, targets, body, headers)
        _check(response)
        return provider_id(response)

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def _pinned_targets(
        self, headers: dict[str, str]
    ) -> list[tuple[httpx.URL, dict[str, str]]]:
        """The account's URL with its host replaced by each checked address; sets ``Host``."""
        host = outbound.check_url(self.account.url, self.allow)
        url = httpx.URL(self.account.url)
        address = outbound.literal_address(host)
        if address is not None:
            outbound.check_addresses(host, [address], self.allow)
            return [(url, {})]
        addresses = await _resolve(host, url.port or (443 if url.scheme == "https" else 80))
        outbound.check_addresses(host, addresses, self.allow)
        headers["Host"] = url.netloc.decode("ascii")
        # TLS still checks the certificate against the name (sni_hostname is its server name).
        return [(url.copy_with(host=str(a)), {"sni_hostname": host}) for a in addresses]


class ClientPool:
    """At most ``max_in_flight`` requests at once, over as few httpx clients of
    ``CONNECTIONS_PER_CLIENT`` connections as hold them: a request waits for a free slot
    (never in httpcore's queue, which is scanned per connection too) and takes the least
    busy client."""

    def __init__(
        self, max_in_flight: int, *, timeout_s: float, verify: ssl.SSLContext | bool = True
    ) -> None:
        limits = httpx.Limits(
            max_connections=CONNECTIONS_PER_CLIENT,
            max_keepalive_connections=CONNECTIONS_PER_CLIENT,
        )
        count = -(-max_in_flight // CONNECTIONS_PER_CLIENT)
        self._clients = [
            httpx.AsyncClient(
                timeout=timeout_s,
                follow_redirects=False,
                trust_env=False,
                limits=limits,
                verify=verify,
            )
            for _ in range(count)
        ]
        self._busy = [0] * count
        self._slots = asyncio.Semaphore(max_in_flight)

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[httpx.AsyncClient]:
        async with self._slots:
            index = min(range(len(self._busy)), key=self._busy.__getitem__)
            self._busy[index] += 1
            try:
                yield self._clients[index]
            finally:
                self._busy[index] -= 1

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


async def _post_first_reachable(
    client: httpx.AsyncClient,
    targets: list[tuple[httpx.URL, dict[str, str]]],
    body: bytes,
    headers: dict[str, str],
) -> httpx.Response:
    """POSTs to the first of the checked addresses that takes a connection."""
    for index, (url, extensions) in enumerate(targets):
        try:
            return await client.post(url, content=body, headers=headers, extensions=extensions)
        except httpx.ConnectError as exc:
            if index + 1 < len(targets):
                continue  # nothing was sent: the host's next checked address may answer
            raise ChannelUnavailable(f"webhook unreachable: ConnectError: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise ChannelUnavailable(f"webhook timed out: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            detail = f"{type(exc).__name__}: {exc}"
            raise ChannelUnavailable(f"webhook unreachable: {detail}") from exc
    raise ChannelUnavailable("webhook host has no checked address")


async def _resolve(host: str, port: int) -> list[outbound.Address]:
    """The addresses ``host`` resolves to now; a DNS failure is retryable."""
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
        )
    except (OSError, TimeoutError) as exc:
        raise ChannelUnavailable(f"webhook host {host!r} does not resolve: {exc}") from exc
    # Scope ids (fe80::1%eth0) are cut off: link-local is refused unless listed anyway.
    addresses = list(
        dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos)
    )
    if not addresses:
        raise ChannelUnavailable(f"webhook host {host!r} resolved to no address")
    return addresses


def provider_id(response: httpx.Response) -> str | None:
    """The receiver's id for what it took: an ``X-Message-Id`` header, else ``id`` in a JSON body."""
    found: object = response.headers.get("X-Message-Id")
    if not found and response.headers.get("Content-Type", "").startswith("application/json"):
        try:
            body = response.json() if len(response.content) <= MAX_ID_BODY_BYTES else None
        except ValueError:
            body = None
        found = body.get("id") if isinstance(body, dict) else None
    if isinstance(found, str | int) and not isinstance(found, bool) and str(found).strip():
        return str(found).strip()[:MAX_ID_CHARS]
    return None


def _check(response: httpx.Response) -> None:
    status = response.status_code
    if 200 <= status < 300:
        return
    reason = f"webhook answered {status} {response.reason_phrase[:80]!r}"
    if status == 429:
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        if retry_after is not None:
            raise RateLimited(reason, retry_after_s=retry_after)
        raise ChannelUnavailable(reason)
    if status >= 500:
        raise ChannelUnavailable(reason)
    raise ChannelRejected(reason)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)
