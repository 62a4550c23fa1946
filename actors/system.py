"""Actors of the system itself: no-op (benchmarks, health) and broker maintenance."""

from __future__ import annotations

import dramatiq

from actors import queues
from actors.middleware.maintenance import run_redis_maintenance
from actors.middleware.retry_policy import RetryPolicy
from mailroom import queues as actor_names


@dramatiq.actor(queue_name=queues.SYSTEM, retry_policy=RetryPolicy(max_attempts=1))
def noop() -> None:
    """Do nothing: the raw throughput baseline for benchmarks."""


@dramatiq.actor(**actor_names.MAINTAIN_BROKER.declared, retry_policy=RetryPolicy(max_attempts=1))
def maintain_broker() -> None:
    """Requeue dead workers' messages now (the scheduler sends this regularly)."""
    from dramatiq.brokers.redis import RedisBroker

    broker = dramatiq.get_broker()
    if isinstance(broker, RedisBroker):
        run_redis_maintenance(broker)
