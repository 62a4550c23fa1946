"""Prometheus metrics of the delivery pipeline (default registry, exported by each process)."""

from __future__ import annotations

from functools import lru_cache

from prometheus_client import Counter, Histogram

#: Messages delivered in full, by channel and account.
DELIVERED = Counter(
    "mailroom_delivery_delivered_total", "Channel messages delivered.", ["channel", "account"]
)
#: Failed sends and given-up messages, by channel, account and reason (retryable,
#: rate_limited, permanent, max_attempts, lease_lost).
FAILED = Counter(
    "mailroom_delivery_failed_total",
    "Failed channel sends, by reason.",
    ["channel", "account", "reason"],
)
#: Time to send one chunk through a channel's middleware chain, in seconds.
SEND_SECONDS = Histogram(
    "mailroom_delivery_send_seconds",
    "Time to send one chunk through its channel.",
    ["channel", "account"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
#: Stream entries the bridge handled, by outcome (forwarded, malformed).
STREAM_ENTRIES = Counter(
    "mailroom_delivery_stream_entries_total", "Stream entries handled by the bridge.", ["outcome"]
)
#: Messages recovered from ``sending``, by outcome (uncertain, resent, delivered).
STALE_RECOVERED = Counter(
    "mailroom_delivery_stale_recovered_total", "Stale sends recovered.", ["outcome"]
)


@lru_cache(maxsize=1024)
def delivered(channel: str, account: str) -> Counter:
    """``DELIVERED`` of (channel, account): ``labels()`` per message cost more than the count."""
    return DELIVERED.labels(channel, account)


@lru_cache(maxsize=1024)
def send_seconds(channel: str, account: str) -> Histogram:
    """``SEND_SECONDS`` of (channel, account), kept like ``delivered``."""
    return SEND_SECONDS.labels(channel, account)
