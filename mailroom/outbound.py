"""Where outbound requests may go, and what may go into a header.

A webhook URL must name a host on the allow-list (``delivery.webhook_allowed_hosts``:
names, ``*.`` wildcards, ``*``, IP addresses and networks) over https (http only when
``delivery.webhook_allow_http`` says so). Every address it reaches must be public
(``ipaddress``' ``is_global``, not multicast) or inside a listed network: a URL
pointing at loopback, a private or link-local network or a cloud metadata address
is refused. Settings check the URL and any literal IP at load; the webhook channel
checks the DNS answer at every send and connects to the address it checked.

A header value with CR, LF or another control character would let text from a
mail or a route start a header of its own: it is refused, never cleaned up.
"""

from __future__ import annotations

import ipaddress
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from mailroom.errors import UnsafeHeaderValue, WebhookTargetRefused
from mailroom.redaction import mask_urls

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class AllowList:
    """Parsed ``delivery.webhook_allowed_hosts``."""

    #: Lower-case host names; ``*.example.com`` matches below it, ``*`` any name.
    names: tuple[str, ...] = ()
    networks: tuple[Network, ...] = ()
    allow_http: bool = False

    @classmethod
    def parse(cls, entries: Iterable[str], *, allow_http: bool = False) -> AllowList:
        """``ValueError`` naming the first entry that is neither a host name nor an IP network."""
        names, networks = [], []
        for entry in entries:
            text = entry.strip().lower()
            try:
                networks.append(ipaddress.ip_network(text.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            label = text.removeprefix("*.")
            if text != "*" and (not label or not all(c.isalnum() or c in ".-" for c in label)):
                raise ValueError(f"{entry!r} is neither a host name, *.domain nor an IP network")
            names.append(text)
        return cls(tuple(names), tuple(networks), allow_http)

    def lists_name(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(
            pattern == "*"
            or pattern == host
            or (pattern.startswith("*.") and host.endswith(pattern[1:]))
            for pattern in self.names
        )

    def lists_address(self, address: Address) -> bool:
        return any(address in network for network in self.networks)


def literal_address(host: str) -> Address | None:
    """The IP address that ``host`` spells, if it is one (IPv4-mapped IPv6 as IPv4)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def check_url(url: str, allow: AllowList) -> str:
    """The host of a webhook ``url`` the allow-list lets through; ``WebhookTargetRefused`` if not.

    A literal IP must be in a listed network; a name must match a listed name (its
    addresses are checked when it is resolved, by ``check_addresses``).
    """
    parts = urlsplit(url)
    shown = mask_urls(url)[:80]  # its user info and secret parameters are credentials
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise WebhookTargetRefused(f"webhook URL {shown!r} is not an http(s) URL with a host")
    if parts.scheme == "http" and not allow.allow_http:
        raise WebhookTargetRefused(
            f"webhook URL {shown!r} is plain http; "
            "use https or set MAILROOM_DELIVERY__WEBHOOK_ALLOW_HTTP"
        )
    host = parts.hostname
    address = literal_address(host)
    if address is not None:
        if not allow.lists_address(address):
            raise WebhookTargetRefused(
                f"webhook address {address} is not in MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS"
            )
    elif not allow.lists_name(host):
        raise WebhookTargetRefused(
            f"webhook host {host!r} is not in MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS"
        )
    return host


def check_addresses(host: str, addresses: Iterable[Address], allow: AllowList) -> None:
    """Refuse ``host`` when any address it resolved to is not public and not listed.

    All of them, not only the first: a name that answers with a public and a private
    address is a rebinding attempt or a mistake either way.
    """
    for address in addresses:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        public = address.is_global and not address.is_multicast
        if not public and not allow.lists_address(address):
            raise WebhookTargetRefused(
                f"webhook host {host!r} resolves to {address}, which is not a public address; "
                "list it in MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS to allow it"
            )


def check_header_value(name: str, value: str) -> str:
    """``value`` if it holds no CR, LF or other control character; ``UnsafeHeaderValue`` if it does.

    A tab is folding white space, allowed; Unicode line and paragraph separators are not.
    """
    for index, char in enumerate(value):
        if char != "\t" and (unicodedata.category(char) == "Cc" or char in "\u2028\u2029"):
            raise UnsafeHeaderValue(
                f"header {name} would carry the control character {char!r} at position {index}"
            )
    return value
