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
import ipaddress
import json
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from mailroom import outbound, webhooks
from mailroom.adapters.channels import Capabilities, register
from mailroom.delivery.ports import Envelope
from mailroom.errors import ChannelRejected, ChannelUnavailable, RateLimited, UnknownAccount
from mailroom.redaction import mask_urls
from mailroom.settings import DeliverySettings, WebhookAccount

if TYPE_CHECKING:  # aiohttp is imported when the first request is sent (worker start-up)
    import aiohttp
    from yarl import URL

#: Longest wait for the DNS answer of a webhook host, in seconds.
RESOLVE_TIMEOUT_S = 10.0

#: Longest provider id kept per chunk, in characters.
MAX_ID_CHARS = 200

#: Largest JSON answer read for an id, in bytes.
MAX_ID_BODY_BYTES = 64 * 1024

#: Longest wait a ``Retry-After`` header may ask for, in seconds.
MAX_RETRY_AFTER_S = 3600.0

#: The body's compact JSON, as ``json.dumps(..., separators=(",", ":"))`` writes it: kept, as
#: ``dumps`` with any option builds an encoder per call.
_JSON = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True)
class Reply:
    """What the channel keeps of an HTTP answer: enough to map it and find the receiver's id."""

    status: int
    reason: str
    headers: Mapping[str, str]
    #: The body, or ``None`` when it is longer than ``MAX_ID_BODY_BYTES`` (never parsed then).
    body: bytes | None


@dataclass(frozen=True)
class Target:
    """Where one attempt goes: the URL with a checked address, and the name TLS checks."""

    url: URL
    server_hostname: str | None = None


@register("webhook", Capabilities(idempotent=True))
class WebhookChannel:
    """POSTs each chunk to the account's URL over one aiohttp session.

    The session's connector opens at most ``max_in_flight`` connections; a request past
    the cap waits in the connector's queue (a future per request, no scan of the pool).
    """

    def __init__(self, account: str, settings: DeliverySettings) -> None:
        found = settings.webhook_accounts.get(account)
        if found is None:
            raise UnknownAccount(f"no webhook account {account[:50]!r}")
        self.account_name = account
        self.account: WebhookAccount = found
        self.allow = settings.webhook_allow_list
        #: Certificates trusted for https: the system's (``True``), or a context (tests' CA).
        self.tls: ssl.SSLContext | bool = True
        # Built on first send: a session belongs to the running loop, and the channel may be
        # built outside it.
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        # The URL checked against the allow-list once: the account and the list are the
        # channel's for its life (a change builds a new channel). A host name (and the parsed
        # URL) is kept; a URL naming an address is its own target, with no DNS to ask.
        self._checked: tuple[str, URL] | None = None
        self._literal: list[Target] | None = None

    async def send(self, envelope: Envelope) -> str | None:
        body = _JSON.encode(
            {
                "message_id": envelope.message_id,
                "chunk": envelope.chunk,
                "chunks": envelope.chunks,
                "recipient": envelope.recipient,
                "subject": envelope.subject,
                "body": envelope.body,
            }
        ).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": envelope.idempotency_key}
        if self.account.secrets:
            secrets = [secret.get_secret_value() for secret in self.account.secrets]
            headers |= webhooks.signature_headers(secrets, envelope.idempotency_key, body)
        for name, value in headers.items():
            # Printable means no control character: only the rest is looked at character by
            # character (a tab is not printable, yet allowed).
            if not value.isprintable():
                outbound.check_header_value(name, value)
        targets = await self._pinned_targets(headers)
        reply = await _post_first_reachable(self._client(), targets, body, headers)
        _check(reply)
        return provider_id(reply)

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._closed:
            # A lane still holding a chain that a refresh replaced: retried on the new one.
            raise ChannelUnavailable("webhook channel closed (its account was reloaded)")
        if self._session is None:
            self._session = client_session(self.account, tls=self.tls)
        return self._session

    async def _pinned_targets(self, headers: dict[str, str]) -> list[Target]:
        """The account's URL with its host replaced by each checked address; sets ``Host``.

        A host name is resolved, and its addresses checked, at every send.
        """
        if self._literal is not None:
            return self._literal
        if self._checked is None:
            from yarl import URL

            host, url = outbound.check_url(self.account.url, self.allow), URL(self.account.url)
            address = outbound.literal_address(host)
            if address is not None:
                outbound.check_addresses(host, [address], self.allow)
                self._literal = [Target(url)]
                return self._literal
            self._checked = host, url
        host, url = self._checked
        addresses = await _resolve(host, url.port or (443 if url.scheme == "https" else 80))
        outbound.check_addresses(host, addresses, self.allow)
        port = "" if url.explicit_port is None else f":{url.explicit_port}"
        headers["Host"] = f"{url.raw_host}{port}"
        # TLS still checks the certificate against the name (and sends it as SNI).
        return [Target(url.with_host(str(a)), server_hostname=host) for a in addresses]


def client_session(
    account: WebhookAccount, *, tls: ssl.SSLContext | bool = True
) -> aiohttp.ClientSession:
    """The session an account's sends go through, in the running loop: at most
    ``max_in_flight`` connections, and timeouts per step of a request.

    Per step, as a request's wait for one of the connections is not its own slowness:
    under a total timeout, lanes queued behind a slow receiver would time out unsent and
    spend attempts. ``bench/delivery.py``'s raw POSTs go through one of these as well.
    """
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=account.max_in_flight, ssl=tls),
        timeout=aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=account.timeout_s, sock_read=account.timeout_s
        ),
        trust_env=False,
    )


async def _post_first_reachable(
    session: aiohttp.ClientSession, targets: list[Target], body: bytes, headers: dict[str, str]
) -> Reply:
    """POSTs to the first of the checked addresses that takes a connection."""
    import aiohttp

    for index, target in enumerate(targets):
        if session.closed:
            raise ChannelUnavailable("webhook channel closed (its account was reloaded)")
        try:
            async with session.post(
                target.url,
                data=body,
                headers=headers,
                allow_redirects=False,
                server_hostname=target.server_hostname,
            ) as response:
                return Reply(
                    response.status,
                    response.reason or "",
                    response.headers,
                    await _read_at_most(response, MAX_ID_BODY_BYTES),
                )
        except TimeoutError as exc:  # aiohttp's own timeouts are TimeoutErrors too
            raise ChannelUnavailable(f"webhook timed out: {type(exc).__name__}") from exc
        except aiohttp.ClientConnectorError as exc:  # certificate refusals included
            if index + 1 < len(targets):
                continue  # nothing was sent: the host's next checked address may answer
            raise ChannelUnavailable(
                f"webhook unreachable: ConnectError: {mask_urls(str(exc))}"
            ) from exc
        except aiohttp.ClientError as exc:
            # aiohttp's messages may quote the URL, whose user info is a credential.
            detail = f"{type(exc).__name__}: {mask_urls(str(exc))}"
            raise ChannelUnavailable(f"webhook unreachable: {detail}") from exc
    raise ChannelUnavailable("webhook host has no checked address")


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body if it is at most ``limit`` bytes, else ``None``; a longer body is not
    read on (its connection is closed, not reused)."""
    if response.content_length == 0:
        # An empty answer (many receivers' 200 or 204) has nothing to wait for.
        return b""
    parts: list[bytes] = []
    size = 0
    async for part in response.content.iter_any():
        size += len(part)
        if size > limit:
            return None
        parts.append(part)
    return b"".join(parts)


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


def provider_id(reply: Reply) -> str | None:
    """The receiver's id for what it took: an ``X-Message-Id`` header, else ``id`` in a JSON body."""
    found: object = reply.headers.get("X-Message-Id")
    if not found and reply.headers.get("Content-Type", "").startswith("application/json"):
        try:
            body = json.loads(reply.body) if reply.body is not None else None
        except ValueError:
            body = None
        found = body.get("id") if isinstance(body, dict) else None
    if isinstance(found, str | int) and not isinstance(found, bool) and str(found).strip():
        return str(found).strip()[:MAX_ID_CHARS]
    return None


def _check(reply: Reply) -> None:
    status = reply.status
    if 200 <= status < 300:
        return
    reason = f"webhook answered {status} {reply.reason[:80]!r}"
    if status == 429:
        retry_after = parse_retry_after(reply.headers.get("Retry-After"))
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
