"""Standard Webhooks signatures: what Mailroom sends, and what a receiver checks.

Each request carries ``webhook-id`` (stable per message and chunk, so a resend has
the same id and the receiver dedupes on it), ``webhook-timestamp`` (unix seconds at
send time) and ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``,
one entry per active secret, space separated, so secrets can be rotated.

A secret is ``whsec_`` followed by the base64 key (the convention's format); any
other string is taken as its UTF-8 bytes (the older raw ``secret`` setting). Keys
shorter than ``MIN_KEY_BYTES`` are refused.

This module is for receivers too: it imports only the standard library.

    from mailroom.webhooks import WebhookVerificationError, verify

    try:
        verify(request.headers, request.body, secrets=["whsec_..."])
    except WebhookVerificationError as exc:
        return 400, str(exc)
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
#: Prefix of a secret in the Standard Webhooks format (the base64 key follows).
SECRET_PREFIX = "whsec_"
#: Shortest key accepted, in bytes (the convention asks for 24 to 64).
MIN_KEY_BYTES = 16
#: Largest difference between a request's timestamp and the receiver's clock, in seconds.
TOLERANCE_S = 300


class WebhookVerificationError(ValueError):
    """The request is not a valid, fresh Mailroom webhook; the message says why.

    Kept here rather than in ``mailroom.errors``: receivers import this module alone.
    """


@functools.lru_cache(maxsize=64)
def secret_key(secret: str) -> bytes:
    """The HMAC key of ``secret`` (``whsec_<base64>`` or a raw string); ``ValueError`` if weak.

    Kept per secret: a sender signs every request with the same few.
    """
    if secret.startswith(SECRET_PREFIX):
        try:
            key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
        except binascii.Error:
            raise ValueError("a whsec_ secret must be followed by base64") from None
    else:
        key = secret.encode()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"a webhook secret must hold at least {MIN_KEY_BYTES} bytes of key")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature of ``body`` sent as ``msg_id`` at ``timestamp``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_headers(
    secrets: Iterable[str], msg_id: str, body: bytes, *, timestamp: int | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers, signed with every secret in ``secrets``."""
    sent_at = int(time.time()) if timestamp is None else timestamp
    signatures = " ".join(sign(secret, msg_id, sent_at, body) for secret in secrets)
    return {ID_HEADER: msg_id, TIMESTAMP_HEADER: str(sent_at), SIGNATURE_HEADER: signatures}


def verify(
    headers: Mapping[str, str],
    body: bytes,
    *,
    secrets: str | Iterable[str],
    tolerance_s: int = TOLERANCE_S,
    now: float | None = None,
) -> str:
    """Check a received request; return its ``webhook-id`` (the key to dedupe on).

    ``secrets`` are the receiver's active secrets (or one): a signature by any of them is
    accepted, so the sender and the receiver can rotate one at a time. The timestamp
    must be within ``tolerance_s`` of ``now`` either way, which bounds replays.

    Raises:
        WebhookVerificationError: a header is missing, the timestamp is stale or not a
            number, a secret is too short or not base64 after ``whsec_``, or no signature
            matches. No other error: a handler catches this one alone.
    """
    found = {name.lower(): value for name, value in headers.items()}
    missing = [h for h in (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER) if not found.get(h)]
    if missing:
        raise WebhookVerificationError(f"missing header {', '.join(missing)}")
    msg_id, stamp = found[ID_HEADER], found[TIMESTAMP_HEADER]
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError(f"{TIMESTAMP_HEADER} is not unix seconds") from None
    age_s = (time.time() if now is None else now) - timestamp
    if abs(age_s) > tolerance_s:
        when = "old" if age_s > 0 else "in the future"
        raise WebhookVerificationError(
            f"stale timestamp: {abs(age_s):.0f} s {when}, tolerance {tolerance_s} s"
        )
    offered = [
        entry.removeprefix("v1,").encode()
        for entry in found[SIGNATURE_HEADER].split(" ")
        if entry.startswith("v1,")
    ]
    active = [secrets] if isinstance(secrets, str) else list(secrets)
    try:
        expected = [sign(secret, msg_id, timestamp, body)[3:].encode() for secret in active]
    except ValueError as exc:
        # A receiver's handler catches this module's error only: a weak or malformed secret
        # of its own must not escape as a bare ValueError (and an HTTP 500).
        raise WebhookVerificationError(f"unusable secret: {exc}") from None
    if not expected:
        raise WebhookVerificationError("no secret to verify with")
    # Every pair is compared, in constant time each, so timing tells nothing about which.
    matches = [hmac.compare_digest(mine, theirs) for mine in expected for theirs in offered]
    if not any(matches):
        raise WebhookVerificationError("bad signature: no v1 signature matches an active secret")
    return msg_id
