"""Enqueues a Redis replica has confirmed, for senders that ack upstream after them.

The NATS bridge acks a batch to JetStream once its actor message is enqueued; from then on
the batch lives only in Redis, and nothing in Postgres would bring it back. Were the master
to die before its replica had the message, Sentinel would promote a replica without it.
So on a Redis with replicas the enqueue goes out in one pipeline with ``WAIT 1 <ms>`` on the
same connection: it returns once a replica has everything the connection wrote, or raises
``ReplicaNotConfirmed`` and the sender leaves the batch unacked for JetStream to redeliver
(the inbox dedupes a batch enqueued twice). On a Redis without replicas it is a plain
enqueue. Redis's ``min-replicas-to-write`` makes the master itself refuse writes while no
replica follows.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from uuid import uuid4

from dramatiq.common import current_millis

from actors.broker.failover import call_within
from mailroom.errors import ReplicaNotConfirmed

#: How long the broker trusts its last count of replicas, in seconds.
REPLICA_CHECK_S = 10.0


class ReplicaCount:
    """The number of replicas following the broker's Redis, asked again every ``REPLICA_CHECK_S``."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._count = 0
        self._checked_at = float("-inf")

    def get(self) -> int:
        with self._lock:
            if time.monotonic() - self._checked_at >= REPLICA_CHECK_S:
                replication = self.client.info("replication")
                self._count = int(replication.get("connected_slaves", 0))
                self._checked_at = time.monotonic()
            return self._count


def enqueue_confirmed(broker: Any, message: Any, *, wait_ms: int) -> Any:
    """Dramatiq's enqueue of ``message`` (no delay), confirmed by a replica when there is one."""
    message = message.copy(options={"redis_message_id": str(uuid4())})
    broker.emit_before("enqueue", message, None)
    queue_name, message_id, data = (
        message.queue_name,
        message.options["redis_message_id"],
        message.encode(),
    )

    def dispatch_and_wait() -> int:
        pipeline = broker.client.pipeline(transaction=False)
        broker.scripts["dispatch"](
            keys=[broker.namespace],
            args=_dispatch_args(broker, "enqueue", queue_name, message_id, data),
            client=pipeline,
        )
        pipeline.execute_command("WAIT", 1, wait_ms)
        return int(pipeline.execute()[-1])

    if broker.replicas.get() == 0:
        broker.do_enqueue(queue_name, message_id, data)
    elif call_within(broker.send_retry_s, dispatch_and_wait) < 1:
        raise ReplicaNotConfirmed(
            f"no Redis replica confirmed the enqueue on {queue_name} within {wait_ms} ms"
        )
    broker.emit_after("enqueue", message, None)
    broker.wakeups.announce(queue_name)
    return message


def _dispatch_args(broker: Any, command: str, queue_name: str, *args: Any) -> list[Any]:
    """The arguments of Dramatiq's dispatch script, as its ``RedisBroker._dispatch`` builds them."""
    return [
        command,
        current_millis(),  # replaced by Redis's clock (clock.py)
        queue_name,
        broker.broker_id,
        broker.heartbeat_timeout,
        broker.dead_message_ttl,
        broker._should_do_maintenance(command),
        broker._max_unpack_size(),
        *args,
    ]
