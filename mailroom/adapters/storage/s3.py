"""S3 (or MinIO, or moto's server) as the object store, through boto3.

boto3 is blocking, so every S3 call runs in a thread; botocore errors leave as
``mailroom.errors`` types.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from mailroom.adapters.storage.store import (
    BucketRole,
    Buckets,
    PutOutcome,
    PutRequest,
    StoredRef,
    check_key,
    gather_outcomes,
    sha256_hex,
)
from mailroom.errors import ObjectNotFound, PermanentError, StorageUnavailable
from mailroom.settings import StorageSettings


class S3Store(Buckets):
    """S3 (or MinIO, or moto's server) through boto3, buckets created on first use."""

    def __init__(self, settings: StorageSettings) -> None:
        super().__init__(settings)
        import boto3
        from botocore.config import Config

        self._client: Any = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            region_name=settings.s3_region,
            aws_access_key_id=settings.s3_access_key or None,
            aws_secret_access_key=settings.s3_secret_key.get_secret_value() or None,
            # A CA bundle, or whether to check the certificate against the system's CAs.
            verify=str(settings.s3_ca_file) if settings.s3_ca_file else settings.s3_verify,
            config=Config(
                retries={"max_attempts": settings.s3_retries},
                connect_timeout=settings.s3_connect_timeout_s,
                read_timeout=settings.s3_read_timeout_s,
            ),
        )
        self._ready: set[str] = set()

    def _translate(self, exc: Exception, what: str) -> Exception:
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound", "NoSuchBucket"):
                return ObjectNotFound(what)
            if code.startswith("5") or code in ("SlowDown", "RequestTimeout", "ServiceUnavailable"):
                return StorageUnavailable(f"{what}: {code}")
            return PermanentError(f"{what}: {code}")
        if isinstance(exc, BotoCoreError):
            return StorageUnavailable(f"{what}: {exc}")
        return exc

    def _bucket_exists(self, bucket: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
                return False
            raise
        return True

    async def missing_buckets(self) -> list[str]:
        missing = []
        for bucket in self.bucket_names():
            try:
                exists = await asyncio.to_thread(self._bucket_exists, bucket)
            except Exception as exc:
                raise self._translate(exc, f"head bucket {bucket}") from exc
            if not exists:
                missing.append(bucket)
        return missing

    async def create_buckets(self) -> list[str]:
        missing = await self.missing_buckets()
        for bucket in missing:
            self._ready.discard(bucket)
            try:
                await asyncio.to_thread(self._ensure_bucket, bucket)
            except Exception as exc:
                raise self._translate(exc, f"create bucket {bucket}") from exc
        return missing

    def _ensure_bucket(self, bucket: str) -> None:
        if bucket in self._ready:
            return
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=bucket)
        except ClientError:
            try:
                self._client.create_bucket(Bucket=bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in (
                    "BucketAlreadyOwnedByYou",
                    "BucketAlreadyExists",
                ):
                    raise
        self._ready.add(bucket)

    def _put(self, bucket: str, r: PutRequest) -> str:
        """Upload ``r``; its SHA-256, computed here (off the event loop) unless it came with it."""
        self._ensure_bucket(bucket)
        self._client.put_object(Bucket=bucket, Key=r.key, Body=r.data, ContentType=r.media_type)
        return r.sha256 or sha256_hex(r.data)

    async def put(self, role: BucketRole, key: str, data: bytes, *, media_type: str) -> StoredRef:
        return await self._put_request(PutRequest(role, key, data, media_type))

    async def put_many(self, requests: Sequence[PutRequest]) -> list[PutOutcome]:
        return await gather_outcomes([self._put_request(r) for r in requests])

    async def _put_request(self, r: PutRequest) -> StoredRef:
        bucket = self.bucket(r.role)
        check_key(r.key)
        try:
            digest = await asyncio.to_thread(self._put, bucket, r)
        except Exception as exc:
            raise self._translate(exc, f"put {bucket}/{r.key}") from exc
        return StoredRef(bucket, r.key, len(r.data), digest, r.media_type)

    def _get(self, bucket: str, key: str) -> bytes:
        response = self._client.get_object(Bucket=bucket, Key=key)
        body = response["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    async def get(self, bucket: str, key: str) -> bytes:
        try:
            return await asyncio.to_thread(self._get, bucket, key)
        except Exception as exc:
            raise self._translate(exc, f"get {bucket}/{key}") from exc

    async def size(self, bucket: str, key: str) -> int:
        try:
            head = await asyncio.to_thread(self._client.head_object, Bucket=bucket, Key=key)
        except Exception as exc:
            raise self._translate(exc, f"head {bucket}/{key}") from exc
        return int(head["ContentLength"])

    async def exists(self, bucket: str, key: str) -> bool:
        try:
            await asyncio.to_thread(self._client.head_object, Bucket=bucket, Key=key)
        except Exception as exc:
            translated = self._translate(exc, f"head {bucket}/{key}")
            if isinstance(translated, ObjectNotFound):
                return False
            raise translated from exc
        return True

    async def delete(self, bucket: str, key: str) -> None:
        try:
            await asyncio.to_thread(self._client.delete_object, Bucket=bucket, Key=key)
        except Exception as exc:
            translated = self._translate(exc, f"delete {bucket}/{key}")
            if not isinstance(translated, ObjectNotFound):  # gone already: what we wanted
                raise translated from exc

    def close(self) -> None:
        self._client.close()
