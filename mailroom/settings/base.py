"""Shared pieces of the settings groups: strict models, ports, TLS files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

#: Loopback ports of the embedded dev stack (``mailroom dev``).
DEV_POSTGRES_PORT = 55432
DEV_REDIS_PORT = 56379
DEV_NATS_PORT = 54222
DEV_IMAP_PORT = 51143
DEV_SMTP_PORT = 52525
DEV_WEBHOOK_PORT = 58080
#: Every port the defaults name, all in Linux's ephemeral range: test servers keep off them
#: (``devtools.stack.free_port``), or one would answer whoever expects nothing there.
DEV_PORTS = frozenset(
    {
        DEV_POSTGRES_PORT,
        DEV_REDIS_PORT,
        DEV_NATS_PORT,
        DEV_IMAP_PORT,
        DEV_SMTP_PORT,
        DEV_WEBHOOK_PORT,
    }
)

#: The variable ``mailroom dev`` and the test harnesses set for their embedded NATS server,
#: which takes no login (``nats.allow_anonymous``).
ALLOW_ANONYMOUS_NATS = "MAILROOM_NATS__ALLOW_ANONYMOUS"
#: Folder under ``state_dir`` where ``mailroom dev`` keeps its Postgres data: where it is
#: missing, no dev stack has run there (``mailroom.process.dev_defaults``).
DEV_STATE_POSTGRES_DIR = "postgres"

#: Standard ports per ``security`` when a mailbox or account gives none (plain needs one).
IMAP_PORTS = {"ssl": 993, "starttls": 143}
SMTP_PORTS = {"ssl": 465, "starttls": 587}

#: Placeholders of route templates, with a sample value each (``notifications.render_route``).
ROUTE_PLACEHOLDERS: dict[str, Any] = {
    "mail_id": 1,
    "mailbox": "billing",
    "uid": 1,
    "mail_subject": "Invoice March",
    "sender": "Billing <billing@example.test>",
    "sender_address": "billing@example.test",
    "sender_name": "Billing",
    "document_types": "invoice",
    "summary": "Mail 'Invoice March' from Billing <billing@example.test>",
}

#: The recognition no-ack window must be this many times the bridge's ack wait (see Settings).
ACK_WINDOW_MARGIN = 2


class StrictModel(BaseModel):
    """A settings group: unknown keys are errors, so a misspelt key is not silently dropped."""

    model_config = ConfigDict(extra="forbid")


def _default_port(data: Any, ports: dict[str, int], default_security: str) -> Any:
    """``data`` with the standard port of its ``security`` filled in when it names none."""
    if isinstance(data, dict) and not data.get("port"):
        security = data.get("security", default_security)
        if security == "plain":
            raise ValueError("security 'plain' has no standard port: give 'port'")
        if security in ports:
            data = {**data, "port": ports[security]}
    return data


class TlsFiles(StrictModel):
    """Certificates of one TLS link, PEM files; each must exist when given."""

    #: CA bundle that signs the server's certificate; empty: the system's CAs.
    ca_file: Path | None = None
    #: Client certificate for servers that ask for one (mutual TLS); needs key_file.
    cert_file: Path | None = None
    #: Private key of cert_file.
    key_file: Path | None = None

    @model_validator(mode="after")
    def _check_files(self) -> TlsFiles:
        """A missing file or a certificate without its key fails at load, not at connect."""
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: give both or neither")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {str(path)!r} is not a file")
        return self

    @property
    def given(self) -> bool:
        return any((self.ca_file, self.cert_file, self.key_file))
