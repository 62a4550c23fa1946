"""Settings of intake: the mailboxes and the limits of what a mail may hold."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from mailroom.settings.base import (
    IMAP_PORTS,
    StrictModel,
    _default_port,
)
from mailroom.settings.oauth import AuthKind, OAuthSettings, check_login

#: An IMAP flag: a keyword (an atom, RFC 3501) or a system flag such as ``\Flagged``.
_IMAP_FLAG = re.compile(r"\\?[^\x00-\x20\x7f(){%*\"\\\]]+")


class MailboxSettings(StrictModel):
    """One IMAP folder that intake reads; ``name`` is what ``poll_mailbox`` is given."""

    name: str
    host: str
    # NOTE: the 0 never stays (_port_for_security fills or refuses it); it lets callers omit it.
    #: Default: 993 for ``ssl``, 143 for ``starttls``; ``plain`` needs it given.
    port: int = 0
    #: ``plain`` sends the password in clear: only for servers on loopback (``mailroom dev``).
    security: Literal["ssl", "starttls", "plain"] = "ssl"
    #: CA bundle that signs the server's certificate (self-signed servers); empty: system CAs.
    ca_file: Path | None = None
    username: str
    #: Needed with auth ``password``; unused with a token login.
    password: SecretStr = SecretStr("")
    #: ``password`` (LOGIN), or ``xoauth2`` / ``oauthbearer`` with a token from ``oauth``.
    auth: AuthKind = "password"
    #: The token endpoint and grant of a token login (keys: token_url, client_id, client_secret,
    #: grant, refresh_token, scope, refresh_margin_s, timeout_s; see the operating guide on logins).
    oauth: OAuthSettings | None = None
    folder: str = "INBOX"
    enabled: bool = True
    #: Most mails one poll ingests; a fuller folder re-sends the poll at once. A poll's own
    #: steps (claim, SELECT, search, finish) cost about as much as 15 small mails, and a
    #: poll's fetches overlap its ingest only from its second chunk on: 50 mails a poll read
    #: a backlog at under half the rate of 500.
    batch_size: int = 500
    #: Watched by the IMAP bridge (``mailroom bridge imap``: NOTIFY or IDLE), which sends a
    #: poll when the server announces new mail; false: read only at the scheduler's passes.
    idle: bool = True
    #: Longest one IDLE of the watcher lasts before it is ended and begun again (servers drop
    #: an IDLE after 30 minutes; a silent connection is noticed by then), in seconds.
    idle_timeout_s: float = Field(default=300.0, gt=0)
    #: A mailbox of real mail: the reference recognizer (``mailroom recognizer``) refuses to
    #: start beside it outside ``mailroom dev``.
    real: bool = False
    #: Connect and read timeout of the IMAP socket, in seconds.
    timeout_s: float = 30.0
    #: Store images shown in the HTML body (by Content-ID) and images under
    #: intake.min_image_bytes without sending them to recognition; false recognizes them too.
    skip_inline_images: bool = True
    #: What intake does to a mail on the server once it is stored: ``none`` leaves it unread
    #: where it is; ``seen`` marks it read; ``flag`` sets after_ingest_flag; ``move`` moves it
    #: to move_to. A failure is logged and never fails or repeats the ingest.
    after_ingest: Literal["none", "seen", "flag", "move"] = "none"
    #: The flag that after_ingest ``flag`` sets: a keyword (``$Mailroom``) or ``\Flagged``.
    after_ingest_flag: str = "$Mailroom"
    #: The folder after_ingest ``move`` moves ingested mail to (it must exist).
    move_to: str | None = None
    #: Days a final mail keeps its body, attachments and result objects; then the retention
    #: pass removes them (rows and documents stay). Empty: kept forever.
    retention_days: int | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _port_for_security(cls, data: Any) -> Any:
        return _default_port(data, IMAP_PORTS, "ssl")

    @model_validator(mode="after")
    def _check_login(self) -> MailboxSettings:
        given = self.password if "password" in self.model_fields_set else None
        check_login(f"mailbox {self.name!r}", self.auth, given, self.oauth)
        return self

    @model_validator(mode="after")
    def _check_after_ingest(self) -> MailboxSettings:
        """A ``move`` with nowhere to go, or a flag the server would refuse, fails at load."""
        if self.after_ingest == "move" and not self.move_to:
            raise ValueError(f"mailbox {self.name!r}: after_ingest 'move' needs move_to (a folder)")
        if self.after_ingest == "move" and self.move_to == self.folder:
            raise ValueError(f"mailbox {self.name!r}: move_to is the folder it reads")
        if not _IMAP_FLAG.fullmatch(self.after_ingest_flag):
            raise ValueError(
                f"mailbox {self.name!r}: after_ingest_flag {self.after_ingest_flag!r} is not an "
                "IMAP flag (a keyword such as $Mailroom, or \\Flagged)"
            )
        return self


class IntakeSettings(StrictModel):
    #: The IMAP folders to read, as a JSON list of objects (keys: see MailboxSettings).
    mailboxes: list[MailboxSettings] = Field(default_factory=list)
    #: Length of a mailbox lease, in seconds; the heartbeat renews it every third.
    lease_s: float = 60.0
    #: IMAP connections of one account open at once in all processes, watchers' and polls'
    #: (counted in Redis); keep it under the server's per-user limit (Dovecot's
    #: mail_max_userip_connections: 10, Gmail: 15). Polls leave one to the watcher.
    max_connections_per_account: int = Field(default=8, ge=2)
    #: Of those, most the watcher holds for one account: NOTIFY needs one, IDLE one a folder
    #: (folders past it are read at the scheduler's passes only).
    watch_connections_per_account: int = Field(default=6, ge=1)
    #: How long a watcher's hold on an account lasts unrenewed: another watcher takes over the
    #: accounts of one that died within it, in seconds.
    watch_lease_s: float = Field(default=30.0, gt=0)
    #: Longest wait before a watcher logs in again after its connection failed, in seconds.
    watch_max_backoff_s: float = Field(default=60.0, gt=0)
    #: How long a NOTIFY watch waits without a word from the server before it asks (a NOOP)
    #: for news the server did not send, in seconds. Dovecot stops sending news by itself when
    #: it renews an account's mailbox list index log (every 5 minutes or more while mail
    #: comes) and then looks only every mailbox_idle_check_interval (30 s); a NOOP makes it
    #: look at once, and a NOOP that finds news sets NOTIFY anew.
    watch_check_s: float = Field(default=1.0, gt=0)
    #: How often the scheduler's pass polls a folder a watcher watches live (a guard against
    #: an announcement lost), in seconds; folders nobody watches are polled at every pass.
    watched_poll_interval_s: float = Field(default=600.0, gt=0)
    #: A poll sent and not yet started after this long is taken for a lost message and sent
    #: again, in seconds. Not tied to lease_s: a poll may wait behind a long intake queue.
    poll_lost_after_s: float = Field(default=900.0, gt=0)
    max_retries: int = 5
    #: Polls in a row whose login, folder or server certificate is refused before the mailbox
    #: is blocked for an operator (reason LOGIN_REFUSED, FOLDER_MISSING or TLS_UNVERIFIED).
    block_after_refusals: int = Field(default=5, ge=1)
    max_backoff_s: float = 300.0
    max_attachment_bytes: int = 25 * 1024 * 1024
    max_mail_bytes: int = 50 * 1024 * 1024
    max_attachments: int = 100
    #: How deep forwarded mails (.eml, message/rfc822), winmail.dat and archives (.zip, .tar,
    #: .tar.gz) are opened for their files; 0 stores them whole, unopened.
    max_nesting: int = 3
    #: Files the archives of one mail may yield, nested archives' included; an archive that
    #: would pass it yields none and waits for an operator (NEEDS_CHECK).
    max_archive_members: int = Field(default=1000, ge=0)
    #: Bytes the archives of one mail may expand to, nested archives' included; checked on the
    #: declared sizes before and on the bytes while decompressing.
    max_archive_bytes: int = Field(default=100 * 1024 * 1024, ge=0)
    #: Largest expanded-to-compressed size ratio of an archive past its first MiB (a bomb).
    max_archive_ratio: int = Field(default=100, ge=1)
    #: Images smaller than this are logos and icons, not documents (see a mailbox's
    #: skip_inline_images), in bytes.
    min_image_bytes: int = 4096
    #: Mails per IMAP FETCH command.
    fetch_chunk: int = 50
    #: Bytes per IMAP FETCH command: mails over fetch_chunk_bytes / fetch_chunk are fetched alone.
    #: Two fetches and three commit groups are in memory at once, so this bounds a poll's memory.
    fetch_chunk_bytes: int = 32 * 1024 * 1024
    #: Mails sent to Postgres together and committed in one transaction (each still fenced on
    #: the lease, in UID order; a group that fails is stored again mail by mail); the next
    #: group is prepared meanwhile.
    commit_group: int = 25
