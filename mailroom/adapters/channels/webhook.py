"""The ``webhook`` channel: HTTP POST of JSON with an ``Idempotency-Key`` per chunk.

Requests are signed by the Standard Webhooks convention (``mailroom.webhooks``) when
the account has secrets; ``webhook-id`` is the idempotency key, so a resend carries
the same id and a fresh timestamp and signature.

2xx is delivered; 429 with ``Retry-After`` is a rate limit; 5xx, timeouts and
connection errors are retryable; any other status is permanent. The receiver
dedupes on the key, so the channel is idempotent and a send left uncertain by a
crash is simply sent again.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from mailroom import webhooks
from mailroom.adapters.channels import register
from mailroom.delivery.ports import Envelope
from mailroom.errors import ChannelRejected, ChannelUnavailable, RateLimited, UnknownAccount
from mailroom.settings import DeliverySettings, WebhookAccount

#: Longest wait a ``Retry-After`` header may ask for, in seconds.
MAX_RETRY_AFTER_S = 3600.0


@register("webhook", idempotent=True)
class WebhookChannel:
    """POSTs each chunk to the account's URL over one pooled HTTP client."""

    def __init__(self, account: str, settings: DeliverySettings) -> None:
        found = settings.webhook_accounts.get(account)
        if found is None:
            raise UnknownAccount(f"no webhook account {account[:50]!r}")
        self.account_name = account
        self.account: WebhookAccount = found
        self._client = httpx.AsyncClient(
            timeout=found.timeout_s, follow_redirects=False, trust_env=False
        )

    async def send(self, envelope: Envelope) -> None:
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
        try:
            response = await self._client.post(self.account.url, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise ChannelUnavailable(f"webhook timed out: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            raise ChannelUnavailable(f"webhook unreachable: {type(exc).__name__}: {exc}") from exc
        _check(response)

    async def aclose(self) -> None:
        await self._client.aclose()


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
