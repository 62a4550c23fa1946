"""A dev IMAP server: pymap on its own event loop thread.

The tests read and write real IMAP through it with pymap's in-memory dict
backend. ``mailroom dev`` gives it a data folder and gets pymap's maildir
backend instead, so the mailbox (its mails, UIDs and UIDVALIDITY) outlives a
restart just as the dev Postgres does: otherwise a restarted server would hand
out UIDs again under a new UIDVALIDITY and intake would read every mail twice.
Helpers create users and folders, APPEND mails and drop a folder (a re-created
folder gets a new UIDVALIDITY).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import threading
from collections.abc import Coroutine, Iterator
from contextlib import AsyncExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from imapclient import IMAPClient

from mailroom.devtools.stack import free_port
from mailroom.settings import MailboxSettings

DEMO_USER = "demouser"
DEMO_PASSWORD = "demopass"


def demo_mailbox(name: str, host: str, port: int) -> dict[str, Any]:
    """The keys of a mailbox read from a dev IMAP server: plain text, the demo login."""
    return {
        "name": name,
        "host": host,
        "port": port,
        "security": "plain",
        "username": DEMO_USER,
        "password": DEMO_PASSWORD,
    }


def _server_args(
    port: int, tls: tuple[Path, Path] | None, data_dir: Path | None = None
) -> argparse.Namespace:
    """pymap's own command line, parsed the way ``pymap --port N --no-tls dict`` would be
    (``… maildir DIR`` with a data folder)."""
    from pymap.backend.dict import DictBackend
    from pymap.backend.maildir import MaildirBackend
    from pymap.imap import IMAPService

    parser = argparse.ArgumentParser()
    parser.add_argument("--debug", action="store_true")
    parser.set_defaults(skip_services=[], passlib_cfg=None)
    backends = parser.add_subparsers(dest="backend")
    DictBackend.add_subparser("dict", backends)
    MaildirBackend.add_subparser("maildir", backends)
    IMAPService.add_arguments(parser)
    args = ["--host", "127.0.0.1", "--port", str(port)]
    args += ["--cert", str(tls[0]), "--key", str(tls[1])] if tls else ["--no-tls"]
    backend = ["maildir", str(data_dir)] if data_dir is not None else ["dict"]
    return parser.parse_args([*args, *backend])


async def _maildir_backend(args: argparse.Namespace) -> tuple[Any, Any]:
    """pymap's maildir backend with all its work on the server's own loop.

    ``MaildirBackend.init`` would run file I/O in a thread pool of its own that
    nothing here could shut down; the dev server's load is one client at a time.
    """
    from pymap.backend.maildir import Config, Login, MaildirBackend
    from pymap.concurrent import Subsystem

    class _Config(Config):
        @classmethod
        def parse_args(cls, args: argparse.Namespace) -> Any:
            return {**super().parse_args(args), "subsystem": Subsystem.for_asyncio()}

    config = _Config.from_args(args, invalid_user_sleep=0.0, cpu_subsystem=Subsystem.for_asyncio())
    Path(config.base_dir).mkdir(parents=True, exist_ok=True)
    return MaildirBackend(Login(config), config), config


def self_signed_certificate(folder: Path, name: str = "127.0.0.1") -> tuple[Path, Path]:
    """A certificate for ``name`` (an IP address or a DNS name) that is its own CA.

    Returns (certificate file, key file), written in ``folder``.
    """
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    try:
        alt_name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        alt_name = x509.DNSName(name)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([alt_name]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / f"{name}-cert.pem", folder / f"{name}-key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


class ImapServer:
    """pymap on its own event loop thread; the methods are called from other threads.

    With ``tls`` (certificate and key files) the server offers STARTTLS. With
    ``data_dir`` it keeps users and mail there (maildir) and starts with no user;
    without, it keeps them in memory and starts with ``demouser`` / ``demopass``.
    """

    def __init__(
        self,
        tls: tuple[Path, Path] | None = None,
        *,
        port: int = 0,
        data_dir: Path | None = None,
    ) -> None:
        self.tls = tls
        self.data_dir = data_dir
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pymap", daemon=True)
        self._stack = AsyncExitStack()
        self._backend: Any = None

    def _run(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _start(self) -> None:
        from pymap.backend.dict import DictBackend
        from pymap.concurrent import Subsystem
        from pymap.imap import IMAPService

        args = _server_args(self.port, self.tls, self.data_dir)
        if self.data_dir is not None:
            backend, config = await _maildir_backend(args)
        else:
            # CPU work (password hashing) on the server's own loop: no thread pool to leak.
            backend, config = await DictBackend.init(
                args, invalid_user_sleep=0.0, cpu_subsystem=Subsystem.for_asyncio()
            )
        config.apply_context()
        await backend.start(self._stack)
        await IMAPService(backend, config).start(self._stack)
        self._backend = backend

    async def _cancel_sessions(self) -> None:
        """End the client sessions still open (an IDLE, say) before the loop closes."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def start(self) -> ImapServer:
        self._thread.start()
        self._run(self._start())
        return self

    def stop(self) -> None:
        try:
            self._run(self._stack.aclose())
            self._run(self._cancel_sessions())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def add_user(self, name: str, password: str) -> None:
        """Create user ``name``, or set its password when it exists."""

        async def add() -> None:
            from pymap.backend import dict as dict_backend
            from pymap.backend import maildir as maildir_backend
            from pymap.user import Passwords, UserMetadata

            config = self._backend.config
            login = self._backend.login
            hashed = await Passwords(config).hash_password(password)
            identity: Any
            if self.data_dir is not None:
                identity = maildir_backend.Identity(config, login.tokens, name, None, frozenset())
            else:
                identity = dict_backend.Identity(name, login, None, frozenset())
            await identity.set(UserMetadata(config, name, password=hashed))

        self._run(add())

    @contextmanager
    def client(self, user: str = DEMO_USER, password: str = DEMO_PASSWORD) -> Iterator[IMAPClient]:
        client = IMAPClient(self.host, port=self.port, ssl=False, timeout=10)
        try:
            client.login(user, password)
            yield client
        finally:
            client.logout()

    def create_folder(
        self, folder: str, *, user: str = DEMO_USER, password: str = DEMO_PASSWORD
    ) -> None:
        with self.client(user, password) as client:
            client.create_folder(folder)

    def delete_folder(
        self, folder: str, *, user: str = DEMO_USER, password: str = DEMO_PASSWORD
    ) -> None:
        with self.client(user, password) as client:
            client.delete_folder(folder)

    def uidvalidity(
        self, folder: str, *, user: str = DEMO_USER, password: str = DEMO_PASSWORD
    ) -> int:
        with self.client(user, password) as client:
            return int(client.folder_status(folder, [b"UIDVALIDITY"])[b"UIDVALIDITY"])

    def uids(
        self, folder: str, *, user: str = DEMO_USER, password: str = DEMO_PASSWORD
    ) -> list[int]:
        """The UIDs of every mail in ``folder``, ascending."""
        with self.client(user, password) as client:
            client.select_folder(folder, readonly=True)
            return sorted(client.search("ALL"))  # imapclient searches by UID

    def append(
        self, folder: str, *mails: bytes, user: str = DEMO_USER, password: str = DEMO_PASSWORD
    ) -> list[int]:
        """APPEND ``mails`` in order on one connection; their UIDs (from APPENDUID)."""
        uids = []
        with self.client(user, password) as client:
            for raw in mails:
                response = client.append(folder, raw)
                match = re.search(rb"APPENDUID \d+ (\d+)", response)
                assert match, response
                uids.append(int(match.group(1)))
        return uids

    def mailbox_settings(self, name: str, folder: str, **overrides: Any) -> MailboxSettings:
        values: dict[str, Any] = {
            **demo_mailbox(name, self.host, self.port),
            "folder": folder,
            "idle": False,
            "timeout_s": 10.0,
            **overrides,
        }
        return MailboxSettings(**values)
