"""One contract for both object stores: the filesystem store and S3 (moto's server)."""

from __future__ import annotations

import uuid

import pytest
from pydantic import SecretStr

from mailroom.adapters.storage import (
    PutRequest,
    S3Store,
    StoredRef,
    build_store,
    content_key,
    sha256_hex,
)
from mailroom.adapters.storage import filesystem as filesystem_module
from mailroom.adapters.storage import s3 as s3_module
from mailroom.errors import InvalidKey, ObjectNotFound
from mailroom.settings import Settings, StorageSettings

pytestmark = pytest.mark.integration


@pytest.fixture(params=["filesystem", "s3"])
def store(request, tmp_path):
    if request.param == "filesystem":
        settings = Settings(state_dir=tmp_path, storage=StorageSettings(kind="filesystem"))
        yield build_store(settings)
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    suffix = uuid.uuid4().hex[:8]
    settings = Settings(
        storage=StorageSettings(
            kind="s3",
            s3_endpoint_url=endpoint,
            s3_access_key="test",
            s3_secret_key=SecretStr("test"),
            mail_bucket=f"mail-{suffix}",
            incoming_bucket=f"incoming-{suffix}",
            results_bucket=f"results-{suffix}",
        )
    )
    s3 = build_store(settings)
    assert isinstance(s3, S3Store)
    yield s3
    s3.close()


async def test_put_then_get_returns_the_same_bytes_under_a_content_key(store):
    data = b"invoice_number,total\nA-1,10.50\n"
    key = content_key(data, prefix="attachments", suffix=".csv")
    ref = await store.put("incoming", key, data, media_type="text/csv")
    assert ref.bucket == store.bucket("incoming")
    assert ref.size == len(data)
    assert ref.sha256 == sha256_hex(data)
    assert key.endswith(f"{ref.sha256}.csv")
    assert await store.get(ref.bucket, key) == data
    assert await store.exists(ref.bucket, key)


async def test_putting_the_same_content_twice_is_idempotent(store):
    data = b"same bytes"
    key = content_key(data, prefix="mail")
    first = await store.put("mail", key, data, media_type="message/rfc822")
    second = await store.put("mail", key, data, media_type="message/rfc822")
    assert first == second
    assert await store.get(first.bucket, key) == data


async def test_missing_object_is_a_clear_permanent_error(store):
    await store.put("results", "present.json", b"{}", media_type="application/json")
    with pytest.raises(ObjectNotFound):
        await store.get(store.bucket("results"), "absent.json")
    assert not await store.exists(store.bucket("results"), "absent.json")


async def test_size_is_read_without_the_object_and_a_missing_one_is_not_found(store):
    ref = await store.put("results", "sized.json", b'{"a": 1}', media_type="application/json")
    assert await store.size(ref.bucket, "sized.json") == 8
    with pytest.raises(ObjectNotFound):
        await store.size(ref.bucket, "absent.json")


@pytest.mark.parametrize(
    "key", ["../escape", "/abs/path", "a/../../b", "a//b", "", "a\x00b", "a\x1bb", "k" * 1025]
)
async def test_unsafe_keys_are_refused(store, key):
    with pytest.raises(InvalidKey):
        await store.put("incoming", key, b"x", media_type="text/plain")


async def test_put_many_stores_each_object_and_reports_an_unsafe_key_on_its_own(store):
    first, second = b"first object", b"second object"
    requests = [
        PutRequest(
            "mail", content_key(first, prefix="mail", suffix=".eml"), first, "message/rfc822"
        ),
        PutRequest("incoming", "../escape", b"x", "text/plain"),
        PutRequest("incoming", content_key(second, prefix="attachments"), second, "text/csv"),
    ]

    stored_first, refused, stored_second = await store.put_many(requests)

    assert isinstance(refused, InvalidKey)
    assert isinstance(stored_first, StoredRef) and isinstance(stored_second, StoredRef)
    assert stored_first.bucket == store.bucket("mail")
    assert stored_second.sha256 == sha256_hex(second)
    assert await store.get(stored_first.bucket, stored_first.key) == first
    assert await store.get(stored_second.bucket, stored_second.key) == second


async def test_put_many_takes_a_requests_digest_instead_of_hashing_again(store, monkeypatch):
    data = b"hashed by the caller"
    digest = sha256_hex(data)

    def no_hashing(data: bytes) -> str:
        raise AssertionError("the store hashed bytes the request gave the digest of")

    monkeypatch.setattr(filesystem_module, "sha256_hex", no_hashing)
    monkeypatch.setattr(s3_module, "sha256_hex", no_hashing)
    key = f"attachments/{digest[:2]}/{digest}.txt"

    [ref] = await store.put_many([PutRequest("incoming", key, data, "text/plain", digest)])

    assert isinstance(ref, StoredRef) and ref.sha256 == digest
    assert await store.get(ref.bucket, key) == data


@pytest.fixture
def filesystem_store(tmp_path):
    return build_store(Settings(state_dir=tmp_path, storage=StorageSettings(kind="filesystem")))


@pytest.fixture
def fsyncs(monkeypatch):
    """Every path fsynced, as (kind, path): files by their open path, folders by name."""
    import os

    synced: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        synced.append(("folder" if os.path.isdir(path) else "file", path))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return synced


async def test_a_torn_object_of_the_right_size_is_repaired_by_the_next_put(filesystem_store):
    data = b"invoice_number,total\nA-1,10.50\n"
    key = content_key(data, prefix="attachments", suffix=".csv")
    path = filesystem_store.root / filesystem_store.bucket("incoming") / key
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\0" * len(data))  # a crash left zeros where the bytes should be

    await filesystem_store.put("incoming", key, data, media_type="text/csv")

    assert path.read_bytes() == data


@pytest.mark.parametrize("many", [False, True], ids=["put", "put_many"])
async def test_a_new_object_and_every_folder_naming_it_are_fsynced(filesystem_store, fsyncs, many):
    data = b"durable bytes"
    key = content_key(data, prefix="mail", suffix=".eml")
    if many:
        [ref] = await filesystem_store.put_many([PutRequest("mail", key, data, "message/rfc822")])
        assert isinstance(ref, StoredRef)
    else:
        await filesystem_store.put("mail", key, data, media_type="message/rfc822")

    path = filesystem_store.root / filesystem_store.bucket("mail") / key
    assert ("file", str(path)) in fsyncs
    # The file's folder and each folder created for it, up to the store's root.
    folder = path.parent
    while folder != filesystem_store.root.parent:
        assert ("folder", str(folder)) in fsyncs, folder
        folder = folder.parent


async def test_create_buckets_creates_every_named_bucket_the_results_one_included(store):
    names = store.bucket_names()
    assert names == [store.bucket("mail"), store.bucket("incoming"), store.bucket("results")]
    assert await store.missing_buckets() == names

    assert await store.create_buckets() == names

    assert await store.missing_buckets() == []
    assert await store.create_buckets() == []
