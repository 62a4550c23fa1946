"""Error hierarchy: retryable vs permanent.

Adapters translate vendor exceptions into these at the boundary and keep the
cause (``raise X(...) from exc``); pipelines and actors only ever see these.
"""

from __future__ import annotations


class AppError(Exception):
    """Unexpected application error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class RetryableError(AppError):
    """The operation may succeed later (timeout, connection lost, 5xx, lock held)."""


class PermanentError(AppError):
    """Retrying cannot help (invalid payload, bad credentials, unknown mailbox)."""


class RateLimited(RetryableError):
    """The remote side asked us to slow down."""

    def __init__(self, message: str | None = None, *, retry_after_s: float) -> None:
        super().__init__(message)
        #: How long the remote side asked us to wait, in seconds.
        self.retry_after_s = retry_after_s

    @property
    def retry_after_ms(self) -> int:
        return max(0, int(self.retry_after_s * 1000))


class InvalidPayload(PermanentError):
    """The message payload does not match its contract."""


class ServiceUnavailable(RetryableError):
    """An external service could not be reached."""


class LeaseLost(RetryableError):
    """Our lease or lock was taken over or expired; the work was abandoned."""


class MigrationLockTimeout(RetryableError):
    """A migration waited too long for a lock and was rolled back; nothing was applied."""
