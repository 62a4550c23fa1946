"""Dovecot on loopback, from Debian's ``dovecot-imapd``: the IMAP server users actually have.

``DovecotServer`` runs ``dovecot -F -c CONFIG`` from a config file written into a folder of
its own (base_dir, state_dir, log and maildirs; plain-text logins from a passwd-file; STARTTLS
and IMAPS with a self-signed certificate, ``.tls``), with the helpers of the pymap server
(``ImapServer``), so its users read and write both the same way. The tests run their Dovecot
contract on it (``tests/fixtures/dovecot.py``), and ``bench/fairness.py`` reads its mailboxes
from it: a server in C costs the shared cores little, as a mail server on another machine
costs Mailroom nothing. Not installed by pip: ``.ci/run`` installs the Debian package.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from imapclient import IMAPClient

from mailroom.devtools.children import remove_folder, spawn, throwaway_folder
from mailroom.devtools.imap import DEMO_PASSWORD, DEMO_USER, ImapServer, self_signed_certificate
from mailroom.devtools.stack import free_port

#: Where Debian puts the binary; /usr/sbin is often missing from a user's PATH.
_SBIN = (Path("/usr/sbin"), Path("/usr/local/sbin"))

#: Size past which Dovecot renews a transaction log 5 minutes old, in bytes (and a margin).
_LIST_LOG_ROTATE_BYTES = 40 * 1024
#: Where a transaction log's header keeps its creation time (``create_stamp``, 32-bit).
_LOG_CREATE_STAMP_OFFSET = 20
#: Changes made with the creation stamp set back before a renewal counts as not happening.
_RENEWAL_TRIES = 5

#: How long the server may take to accept connections, and to stop, in seconds.
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


def find_dovecot() -> Path | None:
    """The ``dovecot`` binary, or None when it is not installed."""
    found = shutil.which("dovecot")
    if found:
        return Path(found)
    for folder in _SBIN:
        if (folder / "dovecot").is_file():
            return folder / "dovecot"
    return None


@contextmanager
def server_folder(prefix: str) -> Iterator[Path]:
    """A folder for one server, removed at the end.

    Under the system's temporary folder, readable by all: Dovecot's mail processes run as
    another user (as root: ``mail``) that must reach the maildirs, which a private folder
    (pytest's, a bench's state) would not let them.
    """
    folder = throwaway_folder(prefix)
    try:
        folder.chmod(0o755)
        yield folder
    finally:
        remove_folder(folder)


def dovecot_version(binary: Path) -> str:
    result = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    return result.stdout.strip() or result.stderr.strip()


def _config(folder: Path, port: int, imaps_port: int, tls: tuple[Path, Path]) -> str:
    """A dovecot.conf for one user, everything under ``folder``: IMAP on ``port`` (plain text
    logins allowed, STARTTLS offered) and IMAPS on ``imaps_port``, with ``tls`` (certificate
    and key files).

    As root Dovecot runs its login and mail processes as the usual users (dovenull, mail);
    as anyone else every process runs as that user (not tried in CI, which runs as root).
    """
    if os.geteuid() == 0:
        internal, login, uid, gid = "dovecot", "dovenull", "mail", "mail"
    else:
        me = pwd.getpwuid(os.geteuid()).pw_name
        internal = login = uid = me
        gid = str(os.getegid())
    return f"""\
protocols = imap
listen = 127.0.0.1
base_dir = {folder}/run
state_dir = {folder}/state
log_path = {folder}/dovecot.log
ssl = yes
ssl_cert = <{tls[0]}
ssl_key = <{tls[1]}
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
default_internal_user = {internal}
default_login_user = {login}
first_valid_uid = 1
first_valid_gid = 1
mail_location = maildir:{folder}/mail/%u
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {folder}/passwd
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={folder}/mail/%u
}}
# No chroots: only root may chroot, and a test server needs none.
service anvil {{
  chroot =
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    port = {port}
  }}
  inet_listener imaps {{
    port = {imaps_port}
    ssl = yes
  }}
}}
"""


class DovecotServer:
    """``dovecot -F`` as a child process, with the IMAP helpers of the pymap server."""

    # The pymap server's helpers use only host, port and IMAP: shared, not copied.
    client = ImapServer.client
    create_folder = ImapServer.create_folder
    delete_folder = ImapServer.delete_folder
    uidvalidity = ImapServer.uidvalidity
    uids = ImapServer.uids
    append = ImapServer.append
    mailbox_settings = ImapServer.mailbox_settings

    def __init__(
        self, binary: Path, folder: Path, *, settings: dict[str, str] | None = None
    ) -> None:
        self.binary = binary
        self.folder = folder
        #: Lines added to the configuration (``mailbox_idle_check_interval``: ``1h``...).
        self.settings = settings or {}
        self.host = "127.0.0.1"
        self.port = free_port()
        self.imaps_port = free_port()
        self.tls = self_signed_certificate(folder)
        self.config_file = folder / "dovecot.conf"
        self.process: subprocess.Popen[bytes] | None = None
        #: Logins besides the demo user's, by name.
        self.users: dict[str, str] = {}

    def log(self) -> str:
        """The end of the server's output and log, for failure messages."""
        paths = [self.folder / "dovecot.out", self.folder / "dovecot.log"]
        text = "".join(p.read_text(errors="replace") for p in paths if p.exists())
        return text[-2000:]

    def start(self) -> DovecotServer:
        for name in ("run", "state", "mail"):
            (self.folder / name).mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.folder / "mail", "mail", "mail")
        extra = "".join(f"{key} = {value}\n" for key, value in self.settings.items())
        self.config_file.write_text(
            _config(self.folder, self.port, self.imaps_port, self.tls) + extra
        )
        users = {DEMO_USER: DEMO_PASSWORD, **self.users}
        (self.folder / "passwd").write_text(
            "".join(f"{name}:{{PLAIN}}{password}\n" for name, password in users.items())
        )
        # What it says before its log is open (a config error) goes to dovecot.out.
        with (self.folder / "dovecot.out").open("wb") as out:
            self.process = spawn(
                [self.binary, "-F", "-c", self.config_file],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def renew_list_index_log(self, user: str = DEMO_USER) -> None:
        """Have Dovecot renew ``user``'s mailbox list index log, as it does at a change once
        the log is over its minimum size and 5 minutes old (no setting brings that forward).

        Folders with long names grow the log past its minimum size (32 KiB), then its header's
        creation stamp is set an hour back and one more folder is made in a new session, until
        the log is a new file.
        """
        log = self.folder / "mail" / user / "dovecot.list.index.log"
        password = self.users.get(user, DEMO_PASSWORD)
        with self._login(user, password) as client:
            while not log.exists() or log.stat().st_size < _LIST_LOG_ROTATE_BYTES:
                client.create_folder(f"padding-{uuid.uuid4().hex}")
        before = log.stat().st_ino
        for _ in range(_RENEWAL_TRIES):
            with log.open("r+b") as file:
                file.seek(_LOG_CREATE_STAMP_OFFSET)
                file.write(struct.pack("<I", int(time.time()) - 3600))
            # A new session: a Dovecot process reads the header once and keeps it.
            with self._login(user, password) as client:
                client.create_folder(f"padding-{uuid.uuid4().hex}")
            if log.stat().st_ino != before:
                return
        raise RuntimeError(f"Dovecot did not renew {log} in {_RENEWAL_TRIES} changes")

    def _login(self, user: str, password: str) -> IMAPClient:
        client = IMAPClient(self.host, port=self.port, ssl=False, timeout=10)
        client.login(user, password)
        return client

    def add_user(self, name: str, password: str) -> DovecotServer:
        """One more login; call it before ``start`` (the passwd-file is written there)."""
        self.users[name] = password
        return self

    def _wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"dovecot exited with {self.process.returncode} at start:\n{self.log()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as sock:
                    if sock.recv(100).startswith(b"* OK"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"dovecot did not answer on port {self.port}:\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the master, which ends its children; kill it if it hangs."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
