"""``mailroom status``: the JetStream stream and consumer, and whether the object store answers.

Read-only: status never creates the stream, the consumer or a bucket.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsConnection

from mailroom.adapters.nats.login import (
    connect_error,
    connect_options,
    refuse_anonymous,
    server_urls,
)
from mailroom.errors import AppError
from mailroom.settings import Settings

#: Object looked up to prove the store answers; it need not exist.
PROBE_KEY = "mailroom-status-probe"


async def jetstream_state(settings: Settings) -> dict[str, Any]:
    """The recognition stream and the inbox's durable consumer, or why they are not there."""
    nats_settings = settings.nats
    if not nats_settings.jetstream:
        return {"enabled": False}
    report: dict[str, Any] = {"enabled": True, "stream_name": nats_settings.stream_name}
    try:
        servers = server_urls(nats_settings)
        refuse_anonymous(nats_settings)
    except AppError as exc:
        report["error"] = str(exc)
        return report
    nc = NatsConnection()

    async def quiet(exc: Exception) -> None:
        """The connect error is reported once, below; nats-py would log each one."""

    try:
        await asyncio.wait_for(
            nc.connect(
                servers=servers,
                name="mailroom-status",
                **connect_options(nats_settings),
                connect_timeout=nats_settings.connect_timeout_s,  # type: ignore[arg-type]
                allow_reconnect=False,
                max_reconnect_attempts=0,
                error_cb=quiet,
            ),
            nats_settings.connect_timeout_s + 1.0,
        )
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        await _close(nc, nats_settings.connect_timeout_s)
        report["error"] = str(connect_error(nats_settings, exc, []))
        return report
    try:
        js = nc.jetstream(timeout=nats_settings.publish_timeout_s)
        try:
            info = await js.stream_info(nats_settings.stream_name)
        except nats.js.errors.NotFoundError:
            report["error"] = "stream not created yet (the first bridge or publisher creates it)"
            return report
        report["stream"] = {
            "messages": info.state.messages,
            "bytes": info.state.bytes,
            "consumers": info.state.consumer_count,
            "replicas": info.config.num_replicas or 1,
            **_cluster_state(info),
        }
        try:
            consumer = await js.consumer_info(
                nats_settings.stream_name, nats_settings.inbox_durable
            )
        except nats.js.errors.NotFoundError:
            report["consumer"] = None
            return report
        report["consumer"] = {
            "name": nats_settings.inbox_durable,
            "pending": consumer.num_pending,
            "ack_pending": consumer.num_ack_pending,
            "redelivered": consumer.num_redelivered,
            "waiting": consumer.num_waiting,
        }
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        report["error"] = f"JetStream did not answer: {type(exc).__name__}"
    finally:
        await _close(nc, nats_settings.connect_timeout_s)
    return report


#: A peer not current, offline, or silent this long is lagging, in seconds (the API: ns).
LAGGING_AFTER_S = 10.0


def _cluster_state(info: Any) -> dict[str, Any]:
    """The stream's leader and its peers that are offline or not current (a clustered stream)."""
    cluster = info.cluster
    if cluster is None or not cluster.leader:
        return {}
    lagging = [
        peer.name
        for peer in cluster.replicas or []
        if not peer.current or peer.offline or (peer.active or 0) > LAGGING_AFTER_S * 1e9
    ]
    return {"leader": cluster.leader, "lagging": lagging}


async def _close(nc: NatsConnection, timeout_s: float) -> None:
    if nc.is_closed:
        return
    try:
        await asyncio.wait_for(nc.close(), timeout_s)
    except (TimeoutError, nats.errors.Error, OSError):
        pass  # a connection that never opened has nothing to flush


async def object_store_state(settings: Settings) -> dict[str, Any]:
    """Whether the object store answers a lookup in the mail bucket."""
    from mailroom.adapters.storage import build_store

    report: dict[str, Any] = {"kind": settings.storage.kind}
    if settings.storage.kind == "filesystem":
        root = settings.storage_root.resolve()
        report["where"] = str(settings.storage.root)
        if root.is_dir():
            report["reachable"] = os.access(root, os.R_OK | os.W_OK | os.X_OK)
        else:
            # A fresh install: the first put creates the folder, if it may.
            parent = next(p for p in root.parents if p.exists())
            report["reachable"] = os.access(parent, os.W_OK | os.X_OK)
            report["note"] = "not created yet (the first stored mail creates it)"
        if not report["reachable"]:
            report["error"] = f"no read and write access to {root}"
        return report
    report["where"] = settings.storage.s3_endpoint_url or "AWS S3"
    store = build_store(settings)
    try:
        await store.exists(store.bucket("mail"), PROBE_KEY)
        report["reachable"] = True
    except AppError as exc:
        report["reachable"] = False
        report["error"] = str(exc)[:200]
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return report
