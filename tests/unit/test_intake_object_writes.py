"""How intake's objects land in the filesystem store: created once, partial files repaired."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import stat

from mailroom.adapters.imap import FetchedMail
from mailroom.adapters.storage import FilesystemStore, PutRequest, StoredRef, content_key
from mailroom.intake import ingest, parsing
from mailroom.settings import IntakeSettings, MailboxSettings, StorageSettings


def _store(tmp_path) -> FilesystemStore:
    return FilesystemStore(StorageSettings(kind="filesystem"), tmp_path)


async def test_a_new_object_is_created_private_under_its_final_name_without_temp_files(tmp_path):
    store = _store(tmp_path)
    data = b"invoice_number,total\nA-1,10.50\n"
    key = content_key(data, prefix="attachments", suffix=".csv")

    ref = await store.put("incoming", key, data, media_type="text/csv")

    path = tmp_path / ref.bucket / key
    assert path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == [path.name]  # no temp file left beside it


async def test_a_half_written_object_from_an_interrupted_put_is_repaired(tmp_path):
    store = _store(tmp_path)
    data = b"From: a@example.com\r\n\r\nbody\r\n"
    key = content_key(data, prefix="mail", suffix=".eml")
    path = tmp_path / store.bucket("mail") / key
    path.parent.mkdir(parents=True)
    path.write_bytes(data[:7])  # a crash mid-write left the first bytes only

    await store.put("mail", key, data, media_type="message/rfc822")

    assert path.read_bytes() == data
    assert os.listdir(path.parent) == [path.name]


async def test_an_existing_complete_object_is_left_untouched(tmp_path):
    store = _store(tmp_path)
    data = b"same bytes"
    key = content_key(data, prefix="mail")
    await store.put("mail", key, data, media_type="message/rfc822")
    path = tmp_path / store.bucket("mail") / key
    inode = path.stat().st_ino

    await store.put("mail", key, data, media_type="message/rfc822")

    assert path.stat().st_ino == inode
    assert path.read_bytes() == data


async def test_put_many_reports_a_failed_object_and_stores_the_others(tmp_path):
    store = _store(tmp_path)
    blocked, fine = b"cannot land", b"lands"
    blocked_key = content_key(blocked, prefix="mail")
    (tmp_path / store.bucket("mail") / blocked_key).mkdir(parents=True)  # a folder in the way
    requests = [
        PutRequest("mail", blocked_key, blocked, "message/rfc822"),
        PutRequest("incoming", content_key(fine, prefix="attachments"), fine, "text/csv"),
    ]

    failed, stored = await store.put_many(requests)

    assert isinstance(failed, OSError)
    assert isinstance(stored, StoredRef) and stored.size == len(fine)
    assert (tmp_path / stored.bucket / stored.key).read_bytes() == fine


def _recording_fsyncs(monkeypatch, fail_on: str | None = None) -> list[str]:
    """Paths fsynced, in order; an fsync of a path ending in ``fail_on`` raises EIO."""

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if fail_on is not None and path.endswith(fail_on):
            raise OSError(errno.EIO, "injected", path)
        real_fsync(fd)
        synced.append(path)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


async def test_put_many_syncs_every_new_file_and_its_folder_across_waves(tmp_path, monkeypatch):
    from mailroom.adapters.storage.filesystem import SYNC_WAVE

    synced = _recording_fsyncs(monkeypatch)
    store = _store(tmp_path)
    blobs = [b"object %d" % n for n in range(SYNC_WAVE + 6)]  # two waves of syncs
    requests = [PutRequest("mail", content_key(b, prefix="mail"), b, "text/plain") for b in blobs]
    open_before = len(os.listdir("/proc/self/fd"))

    refs = await store.put_many(requests)

    for ref in refs:
        assert isinstance(ref, StoredRef)
        path = tmp_path / ref.bucket / ref.key
        assert str(path) in synced
        assert str(path.parent) in synced
    assert len(os.listdir("/proc/self/fd")) == open_before  # every file closed


async def test_an_object_whose_file_cannot_be_synced_is_reported_and_removed(tmp_path, monkeypatch):
    bad, good = b"never durable", b"durable"
    bad_key, good_key = content_key(bad, prefix="mail"), content_key(good, prefix="mail")
    _recording_fsyncs(monkeypatch, fail_on=bad_key.rsplit("/", 1)[1])
    store = _store(tmp_path)

    failed, stored = await store.put_many(
        [PutRequest("mail", bad_key, bad, "text/plain"), PutRequest("mail", good_key, good, "x")]
    )

    assert isinstance(failed, OSError)
    assert isinstance(stored, StoredRef)
    # Not left behind: its bytes may sit only in the page cache, so a later put must rewrite it.
    assert not (tmp_path / store.bucket("mail") / bad_key).exists()
    assert (tmp_path / stored.bucket / good_key).read_bytes() == good


async def test_each_failed_sync_is_reported_for_its_own_objects_among_many(tmp_path, monkeypatch):
    # More syncs than sync threads, so they are dealt out in runs: each outcome must still go
    # to the object it belongs to. One file fails, and one folder (every object under it).
    from mailroom.adapters.storage.filesystem import SYNC_THREADS

    blobs = [b"object %d" % n for n in range(3 * SYNC_THREADS)]
    keys = [content_key(b, prefix="mail") for b in blobs]
    bad_file = keys[5].rsplit("/", 1)[1]
    bad_folder = keys[17].rsplit("/", 2)[1]
    in_bad_folder = {k for k in keys if k.rsplit("/", 2)[1] == bad_folder}
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith((bad_file, "/" + bad_folder)):
            raise OSError(errno.EIO, "injected", path)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)

    outcomes = await _store(tmp_path).put_many(
        [PutRequest("mail", k, b, "text/plain") for k, b in zip(keys, blobs, strict=True)]
    )

    failed = {k for k, outcome in zip(keys, outcomes, strict=True) if isinstance(outcome, OSError)}
    assert failed == {keys[5]} | in_bad_folder
    for key, outcome in zip(keys, outcomes, strict=True):
        if key not in failed:
            assert isinstance(outcome, StoredRef) and outcome.key == key


async def test_an_unexpected_sync_error_fails_its_object_and_every_file_is_closed(
    tmp_path, monkeypatch
):
    # Not an OSError: it must not stop the other syncs dealt into the same run, nor leak files.
    blobs = [b"object %d" % n for n in range(40)]
    keys = [content_key(b, prefix="mail") for b in blobs]
    odd = keys[7].rsplit("/", 1)[1]
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(odd):
            raise RuntimeError("injected")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    open_before = len(os.listdir("/proc/self/fd"))

    store = _store(tmp_path)
    outcomes = await store.put_many(
        [PutRequest("mail", k, b, "text/plain") for k, b in zip(keys, blobs, strict=True)]
    )

    assert isinstance(outcomes[7], RuntimeError)
    assert all(isinstance(o, StoredRef) for n, o in enumerate(outcomes) if n != 7)
    bucket = tmp_path / store.bucket("mail")
    assert not (bucket / keys[7]).exists()
    assert (bucket / keys[8]).read_bytes() == blobs[8]
    assert len(os.listdir("/proc/self/fd")) == open_before


async def test_a_forked_child_stores_objects_with_its_own_sync_threads(tmp_path):
    store = _store(tmp_path)
    await store.put("mail", content_key(b"parent", prefix="mail"), b"parent", media_type="x")
    data = b"child"
    key = content_key(data, prefix="mail")

    pid = os.fork()
    if pid == 0:  # the parent's sync threads are not in the child: it must not wait on them
        signal.alarm(10)  # a child waiting on threads it does not have dies of SIGALRM
        [outcome] = store._put_all([PutRequest("mail", key, data, "x")])
        os._exit(0 if isinstance(outcome, StoredRef) else 1)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / store.bucket("mail") / key).read_bytes() == data


async def test_a_group_hashes_each_mail_and_attachment_once(tmp_path, monkeypatch):
    raw = (
        b"From: a@example.com\r\nMessage-ID: <h@example.com>\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="b"\r\n\r\n--b\r\nContent-Type: text/plain'
        b"\r\n\r\nhi\r\n--b\r\nContent-Type: text/csv\r\nContent-Disposition: attachment; "
        b'filename="i.csv"\r\n\r\ninvoice_number,total\r\nA-1,1.50\r\n--b--\r\n'
    )
    limits = parsing.Limits.for_mailbox(
        IntakeSettings(), MailboxSettings(name="m", host="h", username="u", password="p")
    )
    hashed: list[bytes] = []
    real = hashlib.sha256

    def counting(data: bytes = b"", **kwargs):
        hashed.append(bytes(data))
        return real(data, **kwargs)

    monkeypatch.setattr(hashlib, "sha256", counting)
    fetched = FetchedMail(7, raw, None)

    prepared = await ingest.prepare_group([fetched], store=_store(tmp_path), limits=limits)

    [mail] = prepared.mails
    csv = b"invoice_number,total\r\nA-1,1.50"
    assert sorted(hashed) == sorted([raw, csv])  # the store hashed neither again
    assert mail.raw_ref is not None and mail.raw_ref.sha256 == real(raw).hexdigest()
    [ref] = mail.refs
    assert ref is not None and ref.sha256 == real(csv).hexdigest()
    assert (tmp_path / ref.bucket / ref.key).read_bytes() == csv
