"""Each scheduler job only sends one actor message, to the queue of its workload."""

from __future__ import annotations

import dramatiq

from mailroom.settings import IntakeSettings, MailboxSettings, Settings
from scheduling.jobs import job_table


def _mailbox(name: str, **values: bool) -> MailboxSettings:
    return MailboxSettings(name=name, host="imap.test", username="u", password="p", **values)


def test_every_job_of_the_design_is_in_the_table_and_only_sends(stub_broker):
    settings = Settings(
        intake=IntakeSettings(
            mailboxes=[
                _mailbox("billing"),
                _mailbox("archive", enabled=False),
                _mailbox("claims"),
            ]
        )
    )
    jobs = {job.name: job for job in job_table(settings)}
    assert set(jobs) == {
        "poll_mailboxes",
        "outbox_sweep",
        "deadline_watchdog",
        "unmapped_result_sweep",
        "notification_sweep",
        "stale_delivery_recovery",
        "pending_delivery_readd",
        "broker_maintenance",
        "retention",
    }
    assert jobs["deadline_watchdog"].interval_s == 30

    for job in jobs.values():
        job.send()

    sent = {
        (message.actor_name, message.args)
        for queue in stub_broker.queues.values()
        for message in (dramatiq.Message.decode(data) for data in list(queue.queue))
    }
    # One fan-out for every mailbox: it reads the environment's and the table's at each pass.
    assert ("poll_mailboxes", ()) in sent
    assert {name for name, _ in sent} == {
        "poll_mailboxes",
        "publish_recognition_requests",
        "expire_recognition_deadlines",
        "sweep_unmapped_results",
        "notify_final_mails",
        "recover_stale_deliveries",
        "readd_pending_deliveries",
        "maintain_broker",
        "apply_retention",
    }
