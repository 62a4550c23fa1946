"""Secrets out of text: every URL's credentials masked, and known secret values replaced.

One function masks URLs wherever Mailroom prints one (one-line errors, outage lines,
log records, Sentry events, ``mailroom status``): the password of the user info
(``postgresql://app:***@db``), the whole user info of a NATS URL, which is a token
there (``nats://***@host``), and query parameters that carry a secret
(``?sslpassword=***``, ``&token=***``). User names, hosts and other parameters stay
readable: they say where, and are no secrets.

Known secret values (the settings' ``SecretStr``s) are replaced too, but only where
one stands as a token of its own and only from ``MIN_SECRET_CHARS`` characters up:
a short or word-like value would otherwise blank out every identifier it happens to
spell (a password ``mailroom`` turning each ``mailroom-scheduler`` into
``[redacted]-scheduler``). Identifiers that are no secrets (an S3 access key id, a
user name) are never in that list. The standard library only: adapters, the CLI and
the logging filter all use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: What stands in for a secret inside a URL.
URL_MASK = "***"
#: What stands in for a known secret value found in text.
REDACTED = "[redacted]"
#: Shortest secret value replaced where found in text, in characters.
MIN_SECRET_CHARS = 8
#: URL schemes whose user info without a password is a token (NATS: ``nats://TOKEN@host``).
TOKEN_SCHEMES = frozenset({"nats", "tls", "ws", "wss"})
#: Query parameters (and libpq ``key=value`` options) whose values are secrets, by name part.
SECRET_PARAMETER = re.compile(r"password|passwd|pwd|token|secret|api_?key|signature", re.I)

#: A URL in text: its scheme, user info (user, optional password) and the rest up to a
#: space or quote. The password may hold ``/`` (unencoded); the user name may not.
_URL = re.compile(
    r"(?P<scheme>\b[a-z][a-z0-9+.-]*)://"
    r"(?:(?P<user>[^\s:@/?#'\"<>]*)(?::(?P<password>[^\s@'\"<>]*))?@)?"
    r"(?P<rest>[^\s'\"<>]*)",
    re.I,
)
#: ``name=value`` in a query string or a libpq conninfo string.
_PARAMETER = re.compile(r"(?P<name>[\w.-]+)=(?P<value>[^&;#\s'\"<>]*)")
#: Characters that continue a token: a secret value next to one is part of another word.
_WORD = r"A-Za-z0-9_\-"


def mask_urls(text: str) -> str:
    """``text`` with the credentials of every URL in it, and secret ``key=value``s, masked."""
    return _PARAMETER.sub(_masked_parameter, _URL.sub(_masked_url, text))


def _masked_url(match: re.Match[str]) -> str:
    scheme, user, password = match["scheme"], match["user"], match["password"]
    if password is not None:
        userinfo = f"{user}:{URL_MASK}@"
    elif user is not None:
        userinfo = f"{URL_MASK}@" if user and scheme.lower() in TOKEN_SCHEMES else f"{user}@"
    else:
        userinfo = ""
    return f"{scheme}://{userinfo}{match['rest']}"


def _masked_parameter(match: re.Match[str]) -> str:
    if match["value"] and SECRET_PARAMETER.search(match["name"]):
        return f"{match['name']}={URL_MASK}"
    return match[0]


def has_credentials(url: str) -> bool:
    """Whether ``url`` carries a secret (user info password, NATS token, secret parameter)."""
    return mask_urls(url) != url


def mask_values(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each secret value of ``MIN_SECRET_CHARS`` or more replaced where it
    stands as a token of its own (not inside a longer word, name or identifier)."""
    for secret in secrets:
        if len(secret) >= MIN_SECRET_CHARS and secret in text:
            pattern = rf"(?<![{_WORD}]){re.escape(secret)}(?![{_WORD}])"
            text = re.sub(pattern, REDACTED, text)
    return text


def scrub_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL credentials and the given secret values masked."""
    return mask_values(mask_urls(text), secrets)
