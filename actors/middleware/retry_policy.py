"""Per-actor retry policies, applied by one Dramatiq middleware.

Replaces Dramatiq's ``Retries``: each actor declares ``retry_policy=RetryPolicy(...)``
(backoff base and cap, jitter, attempts, permanent error types, retry-after
support, a hook when attempts run out). Errors a policy expects (``AppError``
and ``dramatiq.Retry``) are logged by the worker at info, not as crashes;
anything else is a bug and is logged with its traceback (and reaches Sentry).
A message this policy gives up, whatever the error, reaches Sentry once, with
its reason kept beside it: ``actors.middleware.dead_letters``.
"""

from __future__ import annotations

import logging
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dramatiq
from dramatiq import Broker, Middleware
from dramatiq.broker import MessageProxy

from mailroom.backoff import backoff
from mailroom.errors import AppError, PermanentError

logger = logging.getLogger(__name__)

#: Dramatiq cannot delay a message longer than seven days, in milliseconds.
MAX_DELAY_MS = 7 * 24 * 3600 * 1000

ExhaustedHook = Callable[[MessageProxy, BaseException], None]


@dataclass(frozen=True)
class RetryPolicy:
    """How one actor retries.

    The n-th retry waits ``min(base_ms * 2**(n-1), cap_ms)`` plus a uniform
    jitter of up to ``jitter`` times that, unless the error carries the wait
    (``RateLimited.retry_after_ms`` or ``dramatiq.Retry(delay=...)``).
    """

    #: First retry delay, in milliseconds.
    base_ms: int = 1_000
    #: Longest delay before jitter, in milliseconds.
    cap_ms: int = 300_000
    #: Largest jitter as a fraction of the delay (0.5 adds up to half again).
    jitter: float = 0.5
    #: Attempts in all, the first included; ``None`` retries forever.
    max_attempts: int | None = 10
    #: Error types that fail the message at once.
    permanent: tuple[type[BaseException], ...] = (PermanentError,)
    #: Honour a wait carried by the error (rate limits).
    retry_after: bool = True
    #: Called once when the message is given up after its last attempt.
    on_exhausted: ExhaustedHook | None = field(default=None, compare=False)

    def backoff_ms(self, retries: int, *, rng: random.Random | None = None) -> int:
        """Delay before retry number ``retries + 1`` (``retries`` already done)."""
        delay = backoff(retries, base=self.base_ms, cap=self.cap_ms, jitter=self.jitter, rng=rng)
        return int(min(delay, MAX_DELAY_MS))

    def delay_ms(self, retries: int, exception: BaseException) -> int:
        if self.retry_after:
            carried = _carried_delay_ms(exception)
            if carried is not None:
                return min(carried, MAX_DELAY_MS)
        return self.backoff_ms(retries)


def _carried_delay_ms(exception: BaseException) -> int | None:
    if isinstance(exception, dramatiq.Retry) and exception.delay is not None:
        return int(exception.delay)
    carried = getattr(exception, "retry_after_ms", None)
    return int(carried) if carried is not None else None


class RetryPolicies(Middleware):
    """Retries failed messages by their actor's ``retry_policy``."""

    #: Errors the worker logs quietly: they are part of the plan, not bugs.
    EXPECTED: tuple[type[BaseException], ...] = (AppError, dramatiq.Retry)

    def __init__(self, *, default: RetryPolicy | None = None) -> None:
        self.default = default or RetryPolicy()

    @property
    def actor_options(self) -> set[str]:
        return {"retry_policy", "throws"}

    def after_declare_actor(self, broker: Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        # Dramatiq's worker reads ``throws`` only to choose the log level.
        declared = actor.options.get("throws") or ()
        if not isinstance(declared, tuple):
            declared = (declared,)
        actor.options["throws"] = (*declared, *self.EXPECTED)

    def policy_for(self, broker: Broker, message: MessageProxy) -> RetryPolicy:
        actor = broker.get_actor(message.actor_name)
        policy = actor.options.get("retry_policy")
        return policy if isinstance(policy, RetryPolicy) else self.default

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        if exception is None:
            return
        policy = self.policy_for(broker, message)
        if isinstance(exception, policy.permanent):
            logger.warning(
                "Message %s (%s) failed permanently: %s",
                message.message_id,
                message.actor_name,
                _describe(exception),
            )
            message.fail()
            return

        retries = message.options.get("retries", 0)
        message.options["retries"] = retries + 1
        message.options["traceback"] = traceback.format_exc(limit=30)
        message.options["requeue_timestamp"] = int(time.time() * 1000)

        if policy.max_attempts is not None and retries + 1 >= policy.max_attempts:
            logger.warning(
                "Message %s (%s) gave up after %d attempts: %s",
                message.message_id,
                message.actor_name,
                retries + 1,
                _describe(exception),
            )
            message.fail()
            if policy.on_exhausted is not None:
                try:
                    policy.on_exhausted(message, exception)
                except Exception:
                    logger.exception("on_exhausted hook of %s failed", message.actor_name)
            return

        delay = policy.delay_ms(retries, exception)
        logger.info(
            "Retrying message %s (%s) in %d ms: %s",
            message.message_id,
            message.actor_name,
            delay,
            _describe(exception),
        )
        # Dramatiq's own Retries enqueues the proxy too (it forwards every Message attribute);
        # Broker.enqueue is annotated with Message only.
        broker.enqueue(message, delay=delay)  # type: ignore[arg-type]


def _describe(exception: BaseException) -> str:
    return f"{type(exception).__name__}: {str(exception)[:200]!r}"
