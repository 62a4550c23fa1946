"""SQLAlchemy 2 models of every table (state machines: ARCHITECTURE.md), one module per pipeline.

Importing this package registers every table on ``Base.metadata`` (what Alembic compares the
database with); each model is importable from here.
"""

from mailroom.db.models.base import NAMING_CONVENTION, Base
from mailroom.db.models.delivery import FINAL_MESSAGE_STATUSES, MESSAGE_STATUSES, ChannelMessage
from mailroom.db.models.intake import (
    BUCKET_ROLES,
    CURSOR_STATUSES,
    FILE_STATUSES,
    FINAL_FILE_STATUSES,
    MAIL_STATUSES,
    ErasedMail,
    InboundMail,
    MailboxCursor,
    ObjectDeletion,
    StoredFile,
    StoredObject,
)
from mailroom.db.models.operations import CONFIG_KINDS, CONFIG_SOURCES, AuditEvent, RuntimeConfig
from mailroom.db.models.recognition import (
    DOCUMENT_STATUSES,
    FINAL_JOB_STATUSES,
    JOB_KINDS,
    JOB_STATUSES,
    PIPELINES,
    Document,
    InboxBatchAttempt,
    RecognitionGate,
    RecognitionJob,
)

__all__ = [
    "BUCKET_ROLES",
    "CONFIG_KINDS",
    "CONFIG_SOURCES",
    "CURSOR_STATUSES",
    "DOCUMENT_STATUSES",
    "FILE_STATUSES",
    "FINAL_FILE_STATUSES",
    "FINAL_JOB_STATUSES",
    "FINAL_MESSAGE_STATUSES",
    "JOB_KINDS",
    "JOB_STATUSES",
    "MAIL_STATUSES",
    "MESSAGE_STATUSES",
    "NAMING_CONVENTION",
    "PIPELINES",
    "AuditEvent",
    "Base",
    "ChannelMessage",
    "Document",
    "ErasedMail",
    "InboundMail",
    "InboxBatchAttempt",
    "MailboxCursor",
    "ObjectDeletion",
    "RecognitionGate",
    "RecognitionJob",
    "RuntimeConfig",
    "StoredFile",
    "StoredObject",
]
