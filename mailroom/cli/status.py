"""``mailroom status``: one screen (or JSON) of where every store stands.

Part of the CLI layer: it reads Postgres, Redis, the queue names of ``actors``
and the leader lock of ``scheduling``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.asyncio as aioredis
from rich.console import Console
from rich.table import Table
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from actors.queues import ALL as QUEUES
from mailroom.adapters.redis_client import CLI_REDIS_ATTEMPTS, async_client
from mailroom.db import create_engine, create_sessionmaker, database_url, libpq_dsn
from mailroom.models import ChannelMessage, InboundMail, MailboxCursor, RecognitionJob, StoredFile
from mailroom.recognition.violations import CONTRACT_ERROR_CODES
from mailroom.settings import Settings
from scheduling.leader import current_leader


async def collect_status(settings: Settings) -> dict[str, Any]:
    """Counts per status in Postgres, queue and stream state in Redis, the scheduler leader."""
    report: dict[str, Any] = {}
    engine = create_engine(settings.database)
    try:
        sessions = create_sessionmaker(engine)
        async with sessions() as session:
            for name, column in (
                ("mails", InboundMail.status),
                ("files", StoredFile.status),
                ("jobs", RecognitionJob.status),
                ("messages", ChannelMessage.status),
                ("cursors", MailboxCursor.status),
            ):
                rows = await session.execute(select(column, func.count()).group_by(column))
                report[name] = {status: count for status, count in rows.all()}
            blocked = await session.execute(
                select(
                    MailboxCursor.mailbox,
                    MailboxCursor.folder,
                    MailboxCursor.blocked_uid,
                    MailboxCursor.last_error,
                ).where(MailboxCursor.status == "blocked")
            )
            report["blocked_cursors"] = [
                {"mailbox": m, "folder": f, "uid": uid, "error": (err or "")[:200]}
                for m, f, uid, err in blocked.all()
            ]
            report["contract_violations"] = await _contract_violations(session)
    finally:
        await engine.dispose()
    report["stopped"] = {
        "jobs_dlq": report["jobs"].get("dlq", 0),
        "jobs_timeout": report["jobs"].get("timeout", 0),
        "jobs_error": report["jobs"].get("error", 0),
        "messages_failed": report["messages"].get("failed", 0),
        "messages_partial_failed": report["messages"].get("partial_failed", 0),
        "messages_uncertain": report["messages"].get("uncertain", 0),
        "cursors_blocked": report["cursors"].get("blocked", 0),
    }
    report.update(await _redis_status(settings))
    report["scheduler_leader"] = await asyncio.to_thread(_leader, settings)
    return report


async def _contract_violations(session: AsyncSession) -> list[dict[str, Any]]:
    """Jobs ended because their service's answer broke the contract, by service and code."""
    service = func.coalesce(RecognitionJob.service_name, "unknown")
    rows = await session.execute(
        select(
            service, RecognitionJob.error_code, func.count(), func.max(RecognitionJob.finished_at)
        )
        .where(RecognitionJob.error_code.in_(CONTRACT_ERROR_CODES))
        .group_by(service, RecognitionJob.error_code)
        .order_by(service, RecognitionJob.error_code)
    )
    return [
        {"service": name, "code": code, "jobs": count, "last": last}
        for name, code, count, last in rows.all()
    ]


async def _redis_status(settings: Settings) -> dict[str, Any]:
    client = async_client(
        settings.broker_redis_url,
        settings.redis,
        attempts=CLI_REDIS_ATTEMPTS,
        decode_responses=True,
    )
    namespace = settings.broker.namespace
    try:
        queues = {}
        for queue in QUEUES:
            queues[queue] = {
                "ready": await client.llen(f"{namespace}:{queue}"),
                "delayed": await client.llen(f"{namespace}:{queue}.DQ"),
                # A message that failed after a delay is dead-lettered under the delay queue.
                "dead": await client.zcard(f"{namespace}:{queue}.XQ")
                + await client.zcard(f"{namespace}:{queue}.DQ.XQ"),
            }
        stream_key = settings.delivery.stream_key
        stream: dict[str, Any] = {"length": await client.xlen(stream_key)}
        try:
            groups = await client.xinfo_groups(stream_key)
        except aioredis.ResponseError:
            groups = []
        for group in groups:
            if group.get("name") == settings.delivery.consumer_group:
                stream["pending"] = group.get("pending")
                stream["lag"] = group.get("lag")
                consumers = await client.xinfo_consumers(stream_key, group["name"])
                stream["consumers"] = {
                    c["name"]: {"pending": c["pending"], "idle_ms": c["idle"]} for c in consumers
                }
        return {"queues": queues, "stream": stream}
    except aioredis.ConnectionError as exc:
        return {"queues": {}, "stream": {}, "redis_error": str(exc)}
    finally:
        await client.aclose()


def _leader(settings: Settings) -> str | None:
    return current_leader(
        libpq_dsn(database_url(settings.database)), settings.scheduler.leader_lock_key
    )


def print_status(settings: Settings, *, as_json: bool = False) -> None:
    report = asyncio.run(collect_status(settings))
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return
    console = Console()
    counts = Table(title="Counts per status")
    counts.add_column("store")
    counts.add_column("status")
    counts.add_column("count", justify="right")
    for store in ("mails", "files", "jobs", "messages", "cursors"):
        for status, count in sorted(report[store].items()):
            counts.add_row(store, status, str(count))
    console.print(counts)
    stopped = Table(title="Stopped work (needs an operator)")
    stopped.add_column("where")
    stopped.add_column("count", justify="right")
    for name, count in report["stopped"].items():
        stopped.add_row(name, str(count), style="bold red" if count else None)
    console.print(stopped)
    if report["blocked_cursors"]:
        blocked = Table(title="Blocked mailboxes")
        for column in ("mailbox", "folder", "uid", "error"):
            blocked.add_column(column)
        for row in report["blocked_cursors"]:
            blocked.add_row(row["mailbox"], row["folder"], str(row["uid"]), row["error"])
        console.print(blocked)
    if report["contract_violations"]:
        violations = Table(title="Recognition answers off the contract (jobs ended as error)")
        for column in ("service", "code", "jobs", "last"):
            violations.add_column(column)
        for row in report["contract_violations"]:
            violations.add_row(row["service"], row["code"], str(row["jobs"]), str(row["last"]))
        console.print(violations)
    queues = Table(title="Dramatiq queues")
    for column in ("queue", "ready", "delayed", "dead letters"):
        queues.add_column(column)
    for queue, depth in report["queues"].items():
        queues.add_row(queue, str(depth["ready"]), str(depth["delayed"]), str(depth["dead"]))
    console.print(queues)
    console.print(f"delivery stream: {report['stream']}")
    if "redis_error" in report:
        console.print(f"[red]redis unavailable: {report['redis_error']}[/]")
    console.print(f"scheduler leader: {report['scheduler_leader'] or 'none'}")
