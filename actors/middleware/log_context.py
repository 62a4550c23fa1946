"""Log records written while a worker runs a message name its actor and message id."""

from __future__ import annotations

import logging

from dramatiq.middleware import CurrentMessage


class MessageContext(logging.Filter):
    """Adds ``actor`` and ``message_id`` from Dramatiq's ``CurrentMessage`` (when there is one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = CurrentMessage.get_current_message()
        if message is not None:
            record.actor = message.actor_name
            record.message_id = message.message_id
        return True


def install_message_context() -> None:
    """On every root handler, once (the JSON format turns the attributes into keys)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, MessageContext) for f in handler.filters):
            handler.addFilter(MessageContext())
