"""Every error of the product, in one tree: retryable vs permanent.

Adapters translate vendor exceptions into these at the boundary and keep the
cause (``raise X(...) from exc``); pipelines and actors only ever see these.
Retryable: the same call may succeed later, so actors retry it and commands
may wait for it. Permanent: it cannot, until someone changes something.

    AppError
    ├── RetryableError
    │   ├── RateLimited
    │   │   └── Throttled                        (our own rate limit of a channel account)
    │   ├── ServiceUnavailable                   (Redis; the base of every *Unavailable)
    │   │   ├── MailboxUnavailable               (IMAP)
    │   │   ├── NatsUnavailable
    │   │   │   └── NatsLoginRefused             (a process exits 2 on it at its start)
    │   │   │       └── NatsAnonymousRefused     (no login, nats.allow_anonymous off)
    │   │   ├── StorageUnavailable               (object store)
    │   │   ├── ChannelUnavailable               (delivery channel provider)
    │   │   └── OAuthTokenUnavailable            (OAuth 2.0 token endpoint)
    │   ├── MailboxCommandFailed
    │   ├── NatsPublishFailed
    │   ├── ReplicaNotConfirmed                  (no Redis replica confirmed an enqueue)
    │   ├── LeaseLost
    │   ├── MigrationLockTimeout
    │   ├── DeliveryDeferred
    │   ├── CursorBusy                           (a poll holds the mailbox cursor)
    │   └── ReviewConflict                       (the file row is locked by another change)
    ├── PermanentError
    │   ├── InvalidPayload
    │   ├── MailboxLoginRejected
    │   ├── MailboxFolderMissing
    │   ├── MailboxCertificateRejected           (IMAP server's TLS certificate)
    │   ├── OAuthTokenRefused
    │   ├── NatsConfigError
    │   ├── ObjectNotFound
    │   ├── InvalidKey
    │   ├── UnknownChannel
    │   ├── UnknownAccount
    │   ├── AccountUnusable                      (disabled, or its stored config unreadable)
    │   ├── RuntimeConfigInvalid                 (a mailbox, account or route row)
    │   ├── ChannelRejected
    │   ├── WebhookTargetRefused                 (URL off the outbound allow-list)
    │   ├── UnsafeHeaderValue                    (CR/LF or a control in a header)
    │   ├── UnknownMailbox
    │   ├── CursorNotFound
    │   ├── ReplayRefused                        (recognition job)
    │   ├── ReviewRefused                        (mailroom review)
    │   ├── NotReplayable                        (channel message)
    │   ├── NotResolvable                        (channel message not uncertain)
    │   ├── MailNotFound                         (intake erase, hold, release)
    │   ├── MailOnLegalHold
    │   ├── InvalidMessage                       (recognition answer off the contract)
    │   ├── ArchiveRefused                       (an attachment's archive over a limit)
    │   └── ExtractionError
    │       ├── UnreadableFile
    │       ├── EmptyFile
    │       └── UnsupportedType
    ├── ClaimsExhausted
    └── MailFailed

    pydantic_settings.SettingsError              (what pydantic-settings' callers catch)
    ├── UnknownSettingError
    ├── InvalidJsonSettingError
    └── SecretFileError

    ValueError
    └── WebhookVerificationError                 (defined in mailroom.webhooks, re-exported)

``WebhookVerificationError`` lives in ``mailroom.webhooks`` because a webhook
receiver imports that module alone (the standard library only). The tooling's own
errors (``mailroom.devtools``) are not the product's and stay out of the tree.
``tests/unit/test_error_tree.py`` checks this drawing against the classes.
"""

from __future__ import annotations

from pydantic_settings import SettingsError

# Re-exported: defined beside ``verify`` for receivers that import that module alone.
from mailroom.webhooks import WebhookVerificationError as WebhookVerificationError

#: Longest error text kept on a cursor or mail row, in characters.
MAX_ERROR_CHARS = 2000


def describe_error(exc: BaseException) -> str:
    """``Type: message`` for cursor rows and logs, without SQL parameters (mail headers)."""
    # Here, not at the top: the settings import this module, and every process (the CLI
    # before it runs Dramatiq's main too) would pay SQLAlchemy's import (about 0.35 s of CPU).
    from sqlalchemy.exc import StatementError

    if isinstance(exc, StatementError) and exc.orig is not None:
        exc = exc.orig  # the driver's message, not SQLAlchemy's echo of the statement
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


class AppError(Exception):
    """Unexpected application error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class RetryableError(AppError):
    """The operation may succeed later (timeout, connection lost, 5xx, lock held)."""


class PermanentError(AppError):
    """Retrying cannot help (invalid payload, bad credentials, unknown mailbox)."""


# --- Retryable ---------------------------------------------------------------------------


class RateLimited(RetryableError):
    """The remote side asked us to slow down."""

    def __init__(self, message: str | None = None, *, retry_after_s: float) -> None:
        super().__init__(message)
        #: How long the remote side asked us to wait, in seconds.
        self.retry_after_s = retry_after_s

    @property
    def retry_after_ms(self) -> int:
        return max(0, int(self.retry_after_s * 1000))


class Throttled(RateLimited):
    """Our own rate limit for this channel account is used up for now."""

    #: Nothing reached the provider, so the delivery attempt is refunded.
    counts_as_attempt = False


class ServiceUnavailable(RetryableError):
    """An external service could not be reached."""


class MailboxUnavailable(ServiceUnavailable):
    """The IMAP server could not be reached, or the connection dropped or timed out."""


class NatsUnavailable(ServiceUnavailable):
    """The NATS server could not be reached or the connection is down."""


class NatsLoginRefused(NatsUnavailable):
    """The NATS server refused the credentials.

    Still a ``NatsUnavailable`` for the code that holds work while NATS is away (the
    recognition gate); a long-running process that meets it at its start exits 2 with
    one line instead of retrying: only a change of its settings can help.
    """


class NatsAnonymousRefused(NatsLoginRefused):
    """A NATS link without a login while ``nats.allow_anonymous`` is off (outside ``mailroom dev``)."""


class StorageUnavailable(ServiceUnavailable):
    """The object store could not be reached."""


class ChannelUnavailable(ServiceUnavailable):
    """The channel's provider could not take the message now."""


class OAuthTokenUnavailable(ServiceUnavailable):
    """The OAuth 2.0 token endpoint could not be reached, timed out or answered 5xx/429."""


class MailboxCommandFailed(RetryableError):
    """The IMAP server answered NO or BAD to a command."""


class NatsPublishFailed(RetryableError):
    """A publish was not confirmed (flush or JetStream ack failed or timed out)."""


class ReplicaNotConfirmed(RetryableError):
    """No Redis replica confirmed an enqueue in time; its sender must not ack upstream."""


class LeaseLost(RetryableError):
    """Our lease or lock was taken over or expired; the work was abandoned."""


class MigrationLockTimeout(RetryableError):
    """A migration waited too long for a lock and stopped: its open transaction was rolled
    back (an index it had already built ``CONCURRENTLY`` stays); a run again goes on."""


class DeliveryDeferred(RetryableError):
    """The message is due again later; retry it after ``retry_after_ms``."""

    def __init__(self, message: str | None = None, *, retry_after_ms: int) -> None:
        super().__init__(message)
        #: When to run again, read by the retry-policy middleware, in milliseconds.
        self.retry_after_ms = retry_after_ms


class CursorBusy(RetryableError):
    """A poll holds the cursor's lease right now; try again when it is done."""


class ReviewConflict(RetryableError):
    """Another operator (or the pipeline) is changing this file right now; look again."""


# --- Permanent ---------------------------------------------------------------------------


class InvalidPayload(PermanentError):
    """The message payload does not match its contract."""


class MailboxLoginRejected(PermanentError):
    """The IMAP server refused the login (wrong credentials or account disabled)."""


class OAuthTokenRefused(PermanentError):
    """The token endpoint refused the grant or the client (invalid_grant, invalid_client)."""


class MailboxFolderMissing(PermanentError):
    """The IMAP folder does not exist on the server (renamed, deleted, or a typo)."""


class MailboxCertificateRejected(PermanentError):
    """The IMAP server's TLS certificate did not verify (expired, another host's, unknown CA)."""


class NatsConfigError(PermanentError):
    """NATS refused our stream or consumer configuration."""


class ObjectNotFound(PermanentError):
    """The object does not exist in the store."""


class InvalidKey(PermanentError):
    """The object key is not a safe relative path."""


class UnknownChannel(PermanentError):
    """No channel plugin of that name is registered."""


class UnknownAccount(PermanentError):
    """The channel has no account of that name in the settings."""


class AccountUnusable(PermanentError):
    """The channel account is disabled, or its stored configuration cannot be read."""


class RuntimeConfigInvalid(PermanentError):
    """A runtime configuration row (mailbox, account, route) is refused or cannot be read."""


class ChannelRejected(PermanentError):
    """The channel's provider refused the message."""


class WebhookTargetRefused(PermanentError):
    """The webhook URL is off the allow-list: not https, or a host or address not allowed."""


class UnsafeHeaderValue(PermanentError):
    """A header value carries CR, LF or another control character (header injection)."""


class UnknownMailbox(PermanentError):
    """No mailbox of that name is configured."""


class CursorNotFound(PermanentError):
    """No cursor matches that mailbox (and folder)."""


class ReplayRefused(PermanentError):
    """This recognition job cannot be replayed."""


class ReviewRefused(PermanentError):
    """This file cannot be reviewed (not NEEDS_CHECK or ERROR, or nothing to accept)."""


class NotReplayable(PermanentError):
    """The channel message is not in a status that can be replayed."""


class NotResolvable(PermanentError):
    """The channel message is not uncertain: there is nothing to resolve."""


class MailNotFound(PermanentError):
    """No inbound mail has that id."""


class MailOnLegalHold(PermanentError):
    """The mail is on legal hold: it cannot be erased until the hold is released."""


class InvalidMessage(PermanentError):
    """A recognition answer that is not a contract message (never retried)."""

    def __init__(
        self, reason: str, job_id: object = None, *, kind: str = "not_contract", service: str = ""
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        #: The job id the message named, if any (untrusted: log it with ``short_repr``).
        self.job_id = job_id
        #: A short fixed category of the fault (a metrics label).
        self.kind = kind
        #: The service name the message gave, cleaned; empty when it gave none.
        self.service = service


class ArchiveRefused(PermanentError):
    """An archive breaks a limit or cannot be read; the message says which, for people.

    Intake records it on the archive's file (``NEEDS_CHECK``); it never fails a mail.
    """


class ExtractionError(PermanentError):
    """The file could not be read."""

    #: The error code a recognition result carries.
    code = "UNREADABLE"


class UnreadableFile(ExtractionError):
    """The file is not readable as its declared type."""

    code = "UNREADABLE"


class EmptyFile(ExtractionError):
    """The file holds no data."""

    code = "EMPTY"


class UnsupportedType(ExtractionError):
    """The file type is not supported by this service."""

    code = "UNSUPPORTED_TYPE"


# --- Neither: the caller decides ---------------------------------------------------------


class ClaimsExhausted(AppError):
    """Attempts at one UID kept ending without a recorded outcome: their workers died."""


class MailFailed(AppError):
    """One mail could not be ingested; the batch stops at its UID."""

    def __init__(self, uid: int, message_id: str | None, cause: BaseException) -> None:
        super().__init__(f"UID {uid}: {describe_error(cause)[:300]}")
        self.uid = uid
        self.message_id = message_id
        self.cause = cause
        #: UIDVALIDITY of the folder the mail was read from; the batch fills it in.
        self.uidvalidity: int | None = None
        #: Workers died on this UID ``max_retries`` times: block at once, unread.
        self.exhausted = False


# --- Settings ----------------------------------------------------------------------------


class UnknownSettingError(SettingsError):
    """A ``MAILROOM_*`` variable that names no setting."""


class InvalidJsonSettingError(SettingsError):
    """A variable of a list, mapping or group setting whose value is not JSON."""


class SecretFileError(SettingsError):
    """A ``MAILROOM_*_FILE`` variable or the secrets directory names a file that cannot be read."""
