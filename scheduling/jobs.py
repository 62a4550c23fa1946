"""The job table: every periodic job's whole body is one ``actor.send(...)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mailroom.settings import Settings


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    interval_s: float
    send: Callable[[], object]


def job_table(settings: Settings) -> list[PeriodicJob]:
    """Every periodic job (ARCHITECTURE.md, Processes), with intervals from settings."""
    from actors import delivery, intake, notifications, recognition, retention, system

    every = settings.scheduler
    # One job for every mailbox: its actor reads the mailboxes of the environment and of the
    # table at each pass, so one added or disabled at runtime counts from the next pass.
    jobs = [PeriodicJob("poll_mailboxes", every.poll_interval_s, intake.poll_mailboxes.send)]
    jobs += [
        PeriodicJob(
            "outbox_sweep",
            every.outbox_sweep_interval_s,
            recognition.publish_recognition_requests.send,
        ),
        PeriodicJob(
            "deadline_watchdog",
            every.watchdog_interval_s,
            recognition.expire_recognition_deadlines.send,
        ),
        PeriodicJob(
            "unmapped_result_sweep",
            every.unmapped_sweep_interval_s,
            recognition.sweep_unmapped_results.send,
        ),
        PeriodicJob(
            "notification_sweep",
            every.notification_sweep_interval_s,
            notifications.notify_final_mails.send,
        ),
        PeriodicJob(
            "stale_delivery_recovery",
            every.stale_delivery_interval_s,
            delivery.recover_stale_deliveries.send,
        ),
        PeriodicJob(
            "pending_delivery_readd",
            every.pending_delivery_interval_s,
            delivery.readd_pending_deliveries.send,
        ),
        PeriodicJob(
            "broker_maintenance", every.broker_maintenance_interval_s, system.maintain_broker.send
        ),
        PeriodicJob("retention", every.retention_interval_s, retention.apply_retention.send),
    ]
    return jobs
