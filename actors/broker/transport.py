"""The broker every process talks through, and sending to an actor by name.

``build_broker`` (``actors/broker/build.py``) gives it the worker's middleware. A process that
only sends (the bridges, the scheduler) sets ``sending_broker``: the same broker class,
client and namespace, without middleware of its own. No Mailroom middleware acts on an
enqueue (theirs run where messages are processed: retries, time limits, dead letters,
log and Sentry context), and sentry-sdk adds its own to every broker when it is on, which
is what passes the trace along. Retry policies, priorities and age limits are options of
the declared actor, read by the worker: a message sent by name carries the same as one
sent through the actor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dramatiq

from mailroom.queues import ActorName
from mailroom.settings import Settings


def broker_for(settings: Settings, middleware: Sequence[dramatiq.Middleware]) -> dramatiq.Broker:
    """A broker for ``settings.broker.kind`` with ``middleware``."""
    kind = settings.broker.kind
    if kind == "stub":
        from dramatiq.brokers.stub import StubBroker

        return StubBroker(middleware=list(middleware))
    if kind == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=settings.broker.rabbitmq_url, middleware=list(middleware))
    from actors.broker.wakeups import WakingRedisBroker
    from mailroom.adapters.redis_client import sync_client

    # A client, not a URL: Dramatiq builds a URL's pool without timeouts or retries. One retry
    # only: it replaces a pooled connection a Redis restart killed, and Dramatiq's consumers
    # restart themselves after that. More retries made a worker whose Redis is down take
    # over a minute to stop (each of its consumers retried every close and requeue). Sends
    # alone are tried again for broker.send_retry_s, through a Sentinel failover (failover.py).
    # Heartbeats and maintenance on Redis's clock, not this process's (broker_clock.py);
    # consumers woken by enqueues rather than polling (wakeups.py).
    return WakingRedisBroker(
        client=sync_client(settings.broker_redis_url, settings.broker_redis, attempts=1),
        namespace=settings.broker.namespace,
        heartbeat_timeout=settings.broker.heartbeat_timeout_ms,
        send_retry_s=settings.broker.send_retry_s,
        replica_wait_ms=settings.broker.replica_wait_ms,
        middleware=list(middleware),
    )


def set_sending_broker(settings: Settings) -> dramatiq.Broker:
    """Build and set the broker of a process that only sends (see ``only_send``)."""
    broker = broker_for(settings, [])
    dramatiq.set_broker(broker)
    return broker


def send(actor: ActorName, *args: Any) -> dramatiq.Message[Any]:
    """Enqueue what ``actor.send(*args)`` would, without importing the actor's module."""
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=actor.queue, actor_name=actor.name, args=args, kwargs={}, options={}
    )
    return dramatiq.get_broker().enqueue(message)


def send_confirmed(actor: ActorName, *args: Any) -> dramatiq.Message[Any]:
    """``send``, returning only once a Redis replica has the message when the broker's Redis
    has replicas (``replicated.py``); for a sender that acks upstream after it."""
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=actor.queue, actor_name=actor.name, args=args, kwargs={}, options={}
    )
    broker = dramatiq.get_broker()
    confirm = getattr(broker, "enqueue_confirmed", None)
    if confirm is None:  # the stub broker of tests, RabbitMQ: no Redis replicas to wait for
        return broker.enqueue(message)
    confirmed: dramatiq.Message[Any] = confirm(message)
    return confirmed
