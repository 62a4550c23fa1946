"""Dramatiq actors: validate the payload, call mailroom, return.

``import actors`` (what ``dramatiq actors`` does) builds the broker from
Settings unless one was set already, then loads every actor module so a worker
or a REPL sees them all; except in a process that only sends by name
(``mailroom.queues.only_send``).
"""

from __future__ import annotations

from mailroom import queues as actor_names

# A process that only sends (the bridges, the scheduler) imports ``actors.broker.transport`` and
# nothing else of the package: no worker broker, no actor module (``actor_names.only_send``).
if actor_names.declares_actors():
    import dramatiq
    import dramatiq.broker

    from actors.broker.build import build_broker
    from actors.middleware.log_context import install_message_context
    from mailroom.settings import Settings

    if dramatiq.broker.global_broker is None:
        _settings = Settings()
        # Before the broker: Sentry hooks Dramatiq.
        from mailroom.process.observability import setup_process

        setup_process(_settings, process="worker")
        # A REPL or a script on the default links beside no ``mailroom dev`` says so once. The
        # stub broker is the tests', which hand their servers to the code themselves.
        if _settings.broker.kind != "stub":
            from mailroom.process.dev_defaults import warn_without_dev_stack

            warn_without_dev_stack(_settings)
        dramatiq.set_broker(build_broker(_settings))

    # Actor modules register on the broker set above; every actor is importable from here
    # (``from actors import poll_mailbox`` in a REPL).
    from actors import delivery, intake, notifications, recognition, retention, system  # noqa: F401
    from actors.delivery import (
        deliver_channel_message,
        deliver_channel_messages,
        readd_pending_deliveries,
        recover_stale_deliveries,
    )
    from actors.intake import poll_mailbox, poll_mailboxes
    from actors.notifications import notify_final_mails
    from actors.recognition import (
        apply_recognition_message,
        apply_recognition_messages,
        expire_recognition_deadlines,
        map_recognition_result,
        map_recognition_results,
        publish_recognition_requests,
        sweep_unmapped_results,
    )
    from actors.retention import apply_retention
    from actors.system import maintain_broker, noop

    __all__ = [
        "apply_recognition_message",
        "apply_recognition_messages",
        "apply_retention",
        "deliver_channel_message",
        "deliver_channel_messages",
        "expire_recognition_deadlines",
        "maintain_broker",
        "map_recognition_result",
        "map_recognition_results",
        "noop",
        "notify_final_mails",
        "poll_mailbox",
        "poll_mailboxes",
        "publish_recognition_requests",
        "readd_pending_deliveries",
        "recover_stale_deliveries",
        "sweep_unmapped_results",
    ]

    # Log lines written while a message runs name its actor and id (the JSON format shows them).
    install_message_context()
