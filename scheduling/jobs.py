"""The job table: every periodic job's whole body is one actor message, sent by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from mailroom import queues as actor_names
from mailroom.settings import Settings


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    interval_s: float
    send: Callable[[], object]


def job_table(settings: Settings) -> list[PeriodicJob]:
    """Every periodic job (ARCHITECTURE.md, Processes), with intervals from settings.

    Each sends through the process's broker (``actors.broker.transport.send``), by the actor's
    name: the scheduler never imports the actors.
    """
    from actors.broker.transport import send

    every = settings.scheduler
    # One job for every mailbox: its actor reads the mailboxes of the environment and of the
    # table at each pass, so one added or disabled at runtime counts from the next pass.
    schedule = [
        ("poll_mailboxes", every.poll_interval_s, actor_names.POLL_MAILBOXES),
        ("outbox_sweep", every.outbox_sweep_interval_s, actor_names.PUBLISH_RECOGNITION_REQUESTS),
        ("deadline_watchdog", every.watchdog_interval_s, actor_names.EXPIRE_RECOGNITION_DEADLINES),
        (
            "unmapped_result_sweep",
            every.unmapped_sweep_interval_s,
            actor_names.SWEEP_UNMAPPED_RESULTS,
        ),
        ("notification_sweep", every.notification_sweep_interval_s, actor_names.NOTIFY_FINAL_MAILS),
        (
            "stale_delivery_recovery",
            every.stale_delivery_interval_s,
            actor_names.RECOVER_STALE_DELIVERIES,
        ),
        (
            "pending_delivery_readd",
            every.pending_delivery_interval_s,
            actor_names.READD_PENDING_DELIVERIES,
        ),
        ("broker_maintenance", every.broker_maintenance_interval_s, actor_names.MAINTAIN_BROKER),
        ("retention", every.retention_interval_s, actor_names.APPLY_RETENTION),
    ]
    return [
        PeriodicJob(name, interval_s, partial(send, actor)) for name, interval_s, actor in schedule
    ]
