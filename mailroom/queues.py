"""Queue names, and the actors other processes send to by name: one registry for both sides.

The actors declare themselves under these names (``actors/``); the bridges and the
scheduler send to them by name (``actors.broker.transport.send``) without importing them:
``import actors`` loads every actor module and all they need (SQLAlchemy, the models,
the pipelines), about a second of CPU at each start of a process that only sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

#: ``poll_mailbox``: IMAP reads, one lease per mailbox.
INTAKE = "intake"
#: ``publish_recognition_requests``: the transactional outbox relay to NATS.
OUTBOX = "outbox"
#: ``apply_recognition_messages``: acks and results from recognition services.
INBOX = "inbox"
#: ``map_recognition_results`` (and ``map_recognition_result``): result files into documents;
#: ``notify_final_mails``: notifications of mails made final.
MAPPING = "mapping"
#: ``deliver_channel_message``: outbound notifications.
DELIVERY = "delivery"
#: Periodic sweeps the scheduler sends (watchdog, stale recovery, re-adds).
MAINTENANCE = "maintenance"
#: No-op and broker upkeep.
SYSTEM = "system"

ALL = (INTAKE, OUTBOX, INBOX, MAPPING, DELIVERY, MAINTENANCE, SYSTEM)


class Declared(TypedDict):
    """Keyword arguments of ``dramatiq.actor``."""

    actor_name: str
    queue_name: str


@dataclass(frozen=True)
class ActorName:
    """An actor's name and queue, as it declares itself and as senders address it."""

    name: str
    queue: str

    @property
    def declared(self) -> Declared:
        """``@dramatiq.actor(**name.declared, …)``: the actor takes this name and queue."""
        return {"actor_name": self.name, "queue_name": self.queue}


# The scheduler's periodic jobs (scheduling/jobs.py).
POLL_MAILBOXES = ActorName("poll_mailboxes", INTAKE)
PUBLISH_RECOGNITION_REQUESTS = ActorName("publish_recognition_requests", OUTBOX)
EXPIRE_RECOGNITION_DEADLINES = ActorName("expire_recognition_deadlines", MAINTENANCE)
SWEEP_UNMAPPED_RESULTS = ActorName("sweep_unmapped_results", MAINTENANCE)
NOTIFY_FINAL_MAILS = ActorName("notify_final_mails", MAPPING)
RECOVER_STALE_DELIVERIES = ActorName("recover_stale_deliveries", MAINTENANCE)
READD_PENDING_DELIVERIES = ActorName("readd_pending_deliveries", MAINTENANCE)
MAINTAIN_BROKER = ActorName("maintain_broker", SYSTEM)
APPLY_RETENTION = ActorName("apply_retention", MAINTENANCE)
# The bridges (bridges/nats.py, bridges/stream.py).
APPLY_RECOGNITION_MESSAGES = ActorName("apply_recognition_messages", INBOX)
DELIVER_CHANNEL_MESSAGES = ActorName("deliver_channel_messages", DELIVERY)
# The IMAP watcher (bridges/imap.py), on news of new mail.
POLL_MAILBOX = ActorName("poll_mailbox", INTAKE)

#: Every name above: each must be a declared actor with its queue (tests/unit).
SENT_BY_NAME = (
    POLL_MAILBOXES,
    PUBLISH_RECOGNITION_REQUESTS,
    EXPIRE_RECOGNITION_DEADLINES,
    SWEEP_UNMAPPED_RESULTS,
    NOTIFY_FINAL_MAILS,
    RECOVER_STALE_DELIVERIES,
    READD_PENDING_DELIVERIES,
    MAINTAIN_BROKER,
    APPLY_RETENTION,
    APPLY_RECOGNITION_MESSAGES,
    DELIVER_CHANNEL_MESSAGES,
    POLL_MAILBOX,
)

#: False in a process that only sends (``only_send``): ``import actors`` then declares none.
_declares_actors = True


def only_send() -> None:
    """Mark this process as one that only sends by name; call it before importing ``actors``.

    ``import actors`` then builds no worker broker and loads no actor module, so the
    process can import ``actors.broker.transport`` for the broker it sends through.
    """
    global _declares_actors
    _declares_actors = False


def declares_actors() -> bool:
    """Does ``import actors`` load the actors here (every process but the senders)?"""
    return _declares_actors
