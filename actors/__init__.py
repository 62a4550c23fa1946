"""Dramatiq actors: validate the payload, call mailroom, return.

``import actors`` (what ``dramatiq actors`` does) builds the broker from
Settings unless one was set already, then loads every actor module so a worker
or a REPL sees them all; except in a process that only sends by name
(``mailroom.actor_names.only_send``).
"""

from __future__ import annotations

from mailroom import actor_names

# A process that only sends (the bridges, the scheduler) imports ``actors.transport`` and
# nothing else of the package: no worker broker, no actor module (``actor_names.only_send``).
if actor_names.declares_actors():
    import dramatiq
    import dramatiq.broker

    from actors.broker import build_broker
    from actors.log_context import install_message_context
    from mailroom.settings import Settings

    if dramatiq.broker.global_broker is None:
        _settings = Settings()
        # Before the broker: Sentry hooks Dramatiq.
        from mailroom.observability import setup_process

        setup_process(_settings, process="worker")
        dramatiq.set_broker(build_broker(_settings))

    # Actor modules register on the broker set above.
    from actors import delivery, intake, recognition, retention, system  # noqa: F401

    # Log lines written while a message runs name its actor and id (the JSON format shows them).
    install_message_context()
