"""Dead letters reach on-call: one Sentry event at ERROR each, and the reason kept with the message.

A message is given up when its actor raised a permanent error or ran out of
attempts (``RetryPolicies`` fails it), or when a middleware failed it
(``AgeLimit``). Sentry's Dramatiq integration skips the errors an actor
``throws`` (every ``AppError``), and Redis keeps only the copy of a message
written when it was last enqueued, so without this middleware a permanent
failure would reach neither Sentry nor ``mailroom dead-letters list``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import redis
from dramatiq import Broker, Middleware
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.errors import ConnectionClosed

from actors.middleware.sentry_tags import message_tags
from mailroom.process.observability import active_sentry
from mailroom.redaction import scrub_text

logger = logging.getLogger(__name__)

#: Message option holding why the message was given up (read by ``mailroom dead-letters``).
REASON_OPTION = "dead_letter_reason"
#: Longest reason kept, in characters.
REASON_CHARS = 300

# Rewrites the stored copy only while it exists: a message the maintenance already
# moved back to its queue must not reappear as an orphan entry.
_REWRITE_STORED = """
if redis.call("hexists", KEYS[1], ARGV[1]) == 1 then
    redis.call("hset", KEYS[1], ARGV[1], ARGV[2])
end
"""


def describe(exception: BaseException) -> str:
    """``Type: message``, at most ``REASON_CHARS`` long."""
    text = str(exception).strip()
    name = type(exception).__name__
    return (f"{name}: {text}" if text else name)[:REASON_CHARS]


class DeadLetters(Middleware):
    """Reports and annotates every message the worker is about to dead-letter.

    Goes before ``RetryPolicies`` in the middleware list: ``after_*`` hooks run in
    reverse order, so this one sees the policy's verdict (``message.failed``) while
    the Sentry integration's scope for the message (with ``SentryTags``) is open.
    """

    def __init__(self, *, secrets: Iterable[str] = ()) -> None:
        self.secrets = frozenset(secrets)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        if exception is not None and message.failed:
            self._give_up(message, exception)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        if message.failed:  # AgeLimit: too old to run
            self._give_up(message, _stuffed_exception(message))

    def before_nack(self, broker: Broker, message: MessageProxy) -> None:
        if REASON_OPTION not in message.options:
            # Failed before any actor ran (an unknown actor): the worker logged it at error.
            stuffed = _stuffed_exception(message)
            message.options[REASON_OPTION] = self._scrub(
                describe(stuffed) if stuffed else "rejected"
            )
        if message.options.get("traceback"):
            message.options["traceback"] = scrub_text(message.options["traceback"], self.secrets)
        if isinstance(broker, RedisBroker) and "redis_message_id" in message.options:
            _rewrite_stored_copy(broker, message)

    def _give_up(self, message: MessageProxy, exception: BaseException | None) -> None:
        reason = self._scrub(describe(exception) if exception else "rejected")
        message.options[REASON_OPTION] = reason
        report_dead_letter(message, exception, reason)

    def _scrub(self, reason: str) -> str:
        return scrub_text(reason, self.secrets)[:REASON_CHARS]


def report_dead_letter(message: Any, exception: BaseException | None, reason: str) -> None:
    """One Sentry event at ERROR tagged with the message's actor, queue and record.

    Captured before the Dramatiq integration looks at the same exception: Sentry's
    dedupe integration then drops the integration's copy, so a message given up
    after an unexpected error is still one event.
    """
    sentry_sdk = active_sentry()
    if sentry_sdk is None:
        return
    with sentry_sdk.new_scope() as scope:
        scope.set_level("error")
        scope.set_tags({**message_tags(message), "dead_letter": "yes"})
        scope.set_context(
            "dead_letter", {"reason": reason, "retries": message.options.get("retries", 0)}
        )
        # One issue per actor and error type, whatever the message text says.
        kind = type(exception).__name__ if exception is not None else "rejected"
        scope.fingerprint = ["dead-letter", message.actor_name, kind]
        if exception is not None:
            sentry_sdk.capture_exception(exception)
        else:
            sentry_sdk.capture_message(f"Dead letter from {message.actor_name}: {reason}")


def _stuffed_exception(message: MessageProxy) -> BaseException | None:
    return getattr(message, "_exception", None)


def _rewrite_stored_copy(broker: RedisBroker, message: MessageProxy) -> None:
    """Store this run's options (reason, traceback) in the copy the nack moves to the XQ."""
    key = f"{broker.namespace}:{message.queue_name}.msgs"
    script = broker.client.register_script(_REWRITE_STORED)
    try:
        script(keys=[key], args=[message.options["redis_message_id"], message.encode()])
    except redis.ConnectionError as exc:
        # The worker retries post-processing (this hook included) on ConnectionClosed.
        raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
    except redis.RedisError:
        logger.warning("Could not store why %s was given up", message.message_id, exc_info=True)
