"""Shared clients of one worker process, created lazily on its event loop.

One event loop per worker process (Dramatiq's ``AsyncIO`` middleware): clients
are created on first use under a lock and closed by ``ResourcesMiddleware``
before the loop stops. Actors reach them with ``current()``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from dramatiq import Broker, Middleware
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from mailroom.adapters.channels import ChannelOutbound
from mailroom.adapters.nats import NatsClient
from mailroom.adapters.storage import ObjectStore, build_store
from mailroom.db.engine import create_engine, create_sessionmaker
from mailroom.intake.account_slots import AccountSlots
from mailroom.intake.connections import ConnectionPool
from mailroom.process.stop_signals import handle_stop_signals
from mailroom.settings import DatabaseSettings, Settings

logger = logging.getLogger(__name__)

#: How long a poll's connection slot lives unrenewed, in seconds: the process renews the slots
#: of its open connections a third of it, so a worker that dies frees them within it.
POLL_SLOT_LEASE_S = 15.0

T = TypeVar("T")

#: Exit code of a worker process killed by a later second signal (Dramatiq's ``RET_KILLED``).
RET_KILLED = 3


class Resources:
    """Lazily built clients for one event loop; ``aclose()`` closes what was built.

    ``concurrency`` is how many actors the worker runs at once (its threads): the
    database pool keeps at least that many connections (``pooled``).
    """

    def __init__(self, settings: Settings, *, concurrency: int = 0) -> None:
        self.settings = settings
        self.concurrency = concurrency
        self._lock: asyncio.Lock | None = None
        self._built: dict[str, Any] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []

    async def _get(
        self, name: str, build: Callable[[], Awaitable[T]], close: Callable[[T], Awaitable[None]]
    ) -> T:
        if name in self._built:
            return self._built[name]  # type: ignore[no-any-return]
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if name not in self._built:
                value = await build()
                self._built[name] = value
                self._closers.append(lambda: close(value))
        return self._built[name]  # type: ignore[no-any-return]

    async def engine(self) -> AsyncEngine:
        async def build() -> AsyncEngine:
            return create_engine(pooled(self.settings.database, self.concurrency))

        async def close(engine: AsyncEngine) -> None:
            await engine.dispose()

        return await self._get("engine", build, close)

    async def sessions(self) -> async_sessionmaker[AsyncSession]:
        engine = await self.engine()

        async def build() -> async_sessionmaker[AsyncSession]:
            return create_sessionmaker(engine)

        async def close(_: object) -> None:
            return None

        return await self._get("sessions", build, close)

    async def redis(self) -> aioredis.Redis:
        async def build() -> aioredis.Redis:
            from mailroom.adapters.redis_client import async_client

            return async_client(self.settings.stream_redis_url, self.settings.stream_redis)

        async def close(client: aioredis.Redis) -> None:
            await client.aclose()

        return await self._get("redis", build, close)

    async def channels(self) -> ChannelOutbound:
        """Delivery channels behind their middleware chains, cached per (channel, account)."""
        from mailroom.adapters.redis import DeliveryRedis

        client = await self.redis()

        sessions = await self.sessions()

        async def build() -> ChannelOutbound:
            from mailroom.config_store.effective import RuntimeAccounts
            from mailroom.config_store.secrets import Cipher

            delivery = self.settings.delivery
            key = self.settings.runtime_config.key.get_secret_value()
            return ChannelOutbound(
                delivery,
                redis=DeliveryRedis(client, stream_key=delivery.stream_key),
                accounts=RuntimeAccounts(sessions, delivery, Cipher(key)),
            )

        async def close(outbound: ChannelOutbound) -> None:
            await outbound.aclose()

        return await self._get("channels", build, close)

    async def nats(self) -> NatsClient:
        """The NATS connection (reconnects by itself once up); ``NatsUnavailable`` if down."""

        async def build() -> NatsClient:
            client = NatsClient(self.settings.nats, name="mailroom-worker")
            await client.connect()
            return client

        async def close(client: NatsClient) -> None:
            await client.close()

        return await self._get("nats", build, close)

    async def store(self) -> ObjectStore:
        """The object store (filesystem or S3) of ``settings.storage``."""

        async def build() -> ObjectStore:
            return build_store(self.settings)

        async def close(store: ObjectStore) -> None:
            closer = getattr(store, "close", None)
            if closer is not None:
                await asyncio.to_thread(closer)

        return await self._get("store", build, close)

    async def imap_connections(self) -> ConnectionPool:
        """Logged-in IMAP connections kept between polls, per account (intake/connections.py)."""

        # NOTE: the client first: ``_get`` holds its lock while it builds, and is not reentrant.
        redis = await self.redis()

        async def build() -> ConnectionPool:
            # Every process's logins count against the account's cap (intake/account_slots.py).
            slots = AccountSlots(
                redis,
                namespace=self.settings.broker.namespace,
                limit=self.settings.intake.max_connections_per_account,
                ttl_s=POLL_SLOT_LEASE_S,
            )
            return ConnectionPool(slots=slots)

        async def close(pool: ConnectionPool) -> None:
            await pool.aclose()

        return await self._get("imap_connections", build, close)

    async def aclose(self) -> None:
        """Close every built client, newest first; one failure never skips the rest."""
        closers, self._closers = self._closers[::-1], []
        self._built.clear()
        for close in closers:
            try:
                await close()
            except Exception:
                logger.warning("Closing a worker resource failed", exc_info=True)


def pooled(database: DatabaseSettings, concurrency: int) -> DatabaseSettings:
    """``database`` with a pool that keeps a connection for each actor running at once.

    SQLAlchemy's pool closes a connection given back while ``pool_size`` others wait
    idle, and opens a new one for the next checkout. An actor holds a connection for its
    longer work (a poll its batch's commits, beside its lease writes), so a pool smaller
    than the worker's threads opened a Postgres session (a forked backend, cold caches,
    statements prepared again) every other poll: 59 for 200 polls at 8 threads and 5
    kept, about 2.5 ms of Postgres CPU a poll.
    """
    if concurrency <= database.pool_size:
        return database
    return database.model_copy(update={"pool_size": concurrency})


_settings: Settings | None = None
_current: Resources | None = None
#: Actors a worker of this process runs at once (its threads), once one booted.
_concurrency = 0


def configure(settings: Settings) -> None:
    """Use ``settings`` for resources built from now on (tests, REPL).

    Resources already built are dropped, not closed: call this before a worker starts.
    """
    global _settings, _current
    _settings, _current = settings, None


def current() -> Resources:
    """This process' resources, built on first use with the configured settings."""
    global _current
    if _current is None:
        _current = Resources(_settings or Settings(), concurrency=_concurrency)
    return _current


class ResourcesMiddleware(Middleware):
    """Fresh resources per worker (its own event loop), closed on that loop at shutdown.

    It also owns how a worker process stops: one stop request, however many copies of
    the signal arrive (``mailroom.process.stop_signals``), so a copy of the first signal never
    becomes Dramatiq's "kill" (``sys.exit`` that then hangs on the event-loop thread).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def after_process_boot(self, broker: Broker) -> None:
        # Emitted only in worker processes of the Dramatiq CLI, never for an in-process Worker,
        # in the main thread and after Dramatiq installed its stop handler: wrap that one.
        graceful = signal.getsignal(signal.SIGTERM)
        if callable(graceful):
            handle_stop_signals(
                graceful, signums=(signal.SIGTERM, signal.SIGHUP), kill_code=RET_KILLED
            )

    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        global _settings, _current, _concurrency
        _settings = _settings or self.settings
        _current = None
        _concurrency = int(getattr(worker, "worker_threads", 0))

    def before_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        global _current
        resources, _current = _current, None
        if resources is None:
            return
        from dramatiq.asyncio import get_event_loop_thread

        loop_thread = get_event_loop_thread()
        if loop_thread is None:
            return
        try:
            loop_thread.run_coroutine(resources.aclose())
        except Exception:
            logger.warning("Closing worker resources failed", exc_info=True)
