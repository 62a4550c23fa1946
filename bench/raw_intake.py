"""A durable raw intake loop: what intake does to a mail, written plainly, for comparison.

imapclient fetches the folder in intake's chunks; each mail is parsed with the stdlib
(``compat32``, as intake parses), its ``.eml`` and attachments are written as files named by
their SHA-256 under two-character folders and synced, files and folders, sixteen at a time
(as the product's filesystem store syncs); then the chunk's rows, one per mail and one per
attachment, are committed in one transaction, Postgres with synchronous commit on. No lease,
no dedupe, no fenced cursor, no transaction per mail, no overlap of fetching, storing and
committing: the same work and durability as intake without its protocol.

``bench/intake.py`` sets intake's rate against it: its RESULT line's baseline.
"""

from __future__ import annotations

import email
import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from email import policy
from pathlib import Path

import psycopg
from imapclient import IMAPClient

from mailroom.db.engine import libpq_dsn

#: Syncs in flight at once, as ``mailroom.adapters.storage.filesystem.SYNC_THREADS``.
SYNC_THREADS = 16

_TABLES = """
CREATE TABLE IF NOT EXISTS raw_mail (
    uid bigint PRIMARY KEY, message_id text, sha256 text NOT NULL, size integer NOT NULL,
    path text NOT NULL
);
CREATE TABLE IF NOT EXISTS raw_file (
    id bigserial PRIMARY KEY, mail_uid bigint NOT NULL REFERENCES raw_mail (uid),
    name text, sha256 text NOT NULL, size integer NOT NULL, path text NOT NULL
);
TRUNCATE raw_file, raw_mail;
"""


def raw_durable_intake(
    port: int, user: str, password: str, folder: str, chunk: int, database_url: str, root: Path
) -> tuple[int, float]:
    """Mails stored and the seconds it took, from login to the last chunk committed."""
    with psycopg.connect(libpq_dsn(database_url)) as db:
        db.execute(_TABLES)
        db.commit()
        with ThreadPoolExecutor(SYNC_THREADS) as syncs:
            started = time.perf_counter()
            client = IMAPClient("127.0.0.1", port=port, ssl=False, timeout=60)
            try:
                client.login(user, password)
                client.select_folder(folder, readonly=True)
                uids = sorted(client.search(["UID", "1:*"]))
                stored = 0
                for start in range(0, len(uids), chunk):
                    fetched = client.fetch(uids[start : start + chunk], ["BODY.PEEK[]"])
                    stored += _store_chunk(db, syncs, root, fetched)
            finally:
                client.logout()
            seconds = time.perf_counter() - started
        # What it counts is there: a row per mail, and the attachments' (each bench mail has one).
        rows = db.execute("SELECT count(*), (SELECT count(*) FROM raw_file) FROM raw_mail")
        mails, files = rows.fetchone() or (0, 0)
        if mails != stored or files < stored:
            raise SystemExit(f"raw loop stored {mails} mails and {files} files of {stored}")
        return stored, seconds


def _store_chunk(
    db: psycopg.Connection, syncs: ThreadPoolExecutor, root: Path, fetched: dict
) -> int:
    mails: list[tuple[int, str | None, str, int, str]] = []
    files: list[tuple[int, str | None, str, int, str]] = []
    written: list[int] = []
    folders: set[str] = set()
    for uid, item in sorted(fetched.items()):
        raw = item[b"BODY[]"]
        path, digest = _write(root / "mail", raw, written, folders)
        message = email.message_from_bytes(raw, policy=policy.compat32)
        mails.append((uid, message.get("Message-ID"), digest, len(raw), path))
        for part in message.walk():
            if part.is_multipart():
                continue
            name = part.get_filename()
            if not name and part.get_content_disposition() != "attachment":
                continue
            data = part.get_payload(decode=True) or b""
            path, digest = _write(root / "files", data, written, folders)
            files.append((uid, name, digest, len(data), path))
    # Every new file and every folder that names one synced before the rows commit.
    list(syncs.map(_sync_and_close, written))
    list(syncs.map(_sync_folder, sorted(folders)))
    with db.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO raw_mail (uid, message_id, sha256, size, path) VALUES (%s, %s, %s, %s, %s)",
            mails,
        )
        cursor.executemany(
            "INSERT INTO raw_file (mail_uid, name, sha256, size, path) VALUES (%s, %s, %s, %s, %s)",
            files,
        )
    db.commit()
    return len(mails)


def _write(bucket: Path, data: bytes, written: list[int], folders: set[str]) -> tuple[str, str]:
    digest = hashlib.sha256(data).hexdigest()
    folder = bucket / digest[:2]
    path = folder / digest
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileNotFoundError:  # its folder is new (and the bucket's, for the first object)
        folder.mkdir(parents=True, exist_ok=True)
        folders.update({str(bucket), str(bucket.parent)})
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # the same content stored before
        return str(path), digest
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    written.append(fd)
    folders.add(str(folder))
    return str(path), digest


def _sync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
