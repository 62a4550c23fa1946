"""Outbound channels as plugins, each behind a middleware chain per (channel, account).

Adding a channel is one module in this package that decorates its class with
``@register("name")``: ``discover()`` imports every module here. A channel is
built per account from ``DeliverySettings`` and raises ``RateLimited``, a
``RetryableError`` or a ``PermanentError`` (vendor errors stop in its module).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.ports import Envelope, Send
from mailroom.errors import AccountUnusable, UnknownChannel
from mailroom.settings import DeliverySettings

if TYPE_CHECKING:
    from mailroom.config_store.effective import RuntimeAccounts

logger = logging.getLogger(__name__)


class Channel(Protocol):
    """One channel bound to one account."""

    async def send(self, envelope: Envelope) -> str | None:
        """Send one chunk; the provider's id for it, when it gives one."""
        ...

    async def aclose(self) -> None: ...


#: Builds a channel for (account name, settings); raises ``UnknownAccount``.
ChannelFactory = Callable[[str, DeliverySettings], Channel]


@dataclass(frozen=True)
class Capabilities:
    """What a channel declares about its deliveries.

    Chunk sizes and rate limits are the operator's (``delivery.chunk_size``,
    ``delivery.rate_limits``), not the channel's: no channel has one of its own.
    """

    #: The receiver deduplicates resends by the envelope's idempotency key.
    idempotent: bool = False


@dataclass(frozen=True)
class ChannelPlugin:
    name: str
    factory: ChannelFactory
    capabilities: Capabilities = Capabilities()

    @property
    def idempotent(self) -> bool:
        return self.capabilities.idempotent


_PLUGINS: dict[str, ChannelPlugin] = {}

#: Modules of this package that are not channels.
_NOT_CHANNELS = frozenset({"middleware"})


def register(
    name: str, capabilities: Capabilities = Capabilities()
) -> Callable[[ChannelFactory], ChannelFactory]:
    """Class decorator: make the channel available under ``name``."""

    def decorate(factory: ChannelFactory) -> ChannelFactory:
        _PLUGINS[name] = ChannelPlugin(name=name, factory=factory, capabilities=capabilities)
        return factory

    return decorate


def discover() -> dict[str, ChannelPlugin]:
    """Import every channel module of this package; returns the registry."""
    for module in pkgutil.iter_modules(__path__):
        if module.name not in _NOT_CHANNELS and not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return dict(_PLUGINS)


def plugin(name: str) -> ChannelPlugin:
    found = _PLUGINS.get(name) or discover().get(name)
    if found is None:
        raise UnknownChannel(f"unknown channel {name[:50]!r}")
    return found


class ChannelOutbound:
    """Channels behind their middleware chains, built once per (channel, account) and cached.

    Meets ``mailroom.delivery.ports.Outbound``. ``invalidate`` drops a chain (after
    a settings change, or a provider's credentials rotated) and closes its channel.
    """

    def __init__(
        self,
        settings: DeliverySettings,
        *,
        redis: DeliveryRedis | None = None,
        accounts: RuntimeAccounts | None = None,
    ) -> None:
        from mailroom.adapters.channels.middleware import default_middleware

        self.settings = settings
        self.redis = redis
        self.middleware_factories = default_middleware()
        self._chains: dict[tuple[str, str], tuple[Channel, Send]] = {}
        #: The table of channel accounts (``mailroom accounts``); None: the settings only.
        self.accounts = accounts
        #: ``channel:account`` -> why it cannot send (disabled, broken row).
        self._unusable: dict[str, str] = {}
        self._rows: frozenset[str] = frozenset()

    async def refresh(self) -> None:
        """Take the table's accounts when a row changed; chains of changed rows are rebuilt."""
        if self.accounts is None:
            return
        snapshot = await self.accounts.changed()
        if snapshot is None:
            return
        # Any row may have changed: drop the chains of every account the table names.
        stale = self._rows | snapshot.names
        self.settings, self._unusable, self._rows = (
            snapshot.settings,
            snapshot.unusable,
            snapshot.names,
        )
        for channel, account in list(self._chains):
            if f"{channel}:{account}" in stale:
                await self.invalidate(channel, account)

    def sender(self, channel: str, account: str) -> Send:
        key = (channel, account)
        cached = self._chains.get(key)
        if cached is None:
            unusable = self._unusable.get(f"{channel}:{account}")
            if unusable is not None:
                raise AccountUnusable(unusable)
            instance = plugin(channel).factory(account, self.settings)
            send: Send = instance.send
            for factory in reversed(self.middleware_factories):
                middleware = factory(channel, account, self.settings, self.redis)
                if middleware is not None:
                    send = middleware.wrap(send)
            cached = self._chains[key] = (instance, send)
        return cached[1]

    def is_idempotent(self, channel: str) -> bool:
        try:
            return plugin(channel).idempotent
        except UnknownChannel:
            return False

    async def invalidate(self, channel: str, account: str) -> None:
        """Forget the chain of (channel, account); the next send builds it anew."""
        cached = self._chains.pop((channel, account), None)
        if cached is not None:
            await _close(cached[0])

    async def aclose(self) -> None:
        chains, self._chains = list(self._chains.values()), {}
        await asyncio.gather(*(_close(instance) for instance, _ in chains))


async def _close(instance: Channel) -> None:
    try:
        await instance.aclose()
    except Exception:
        logger.warning("Closing channel %s failed", type(instance).__name__, exc_info=True)
