"""``mailroom status``: one screen (or JSON) of where every store and link stands.

Part of the CLI layer: it reads Postgres, Redis (the broker's and the stream's),
NATS JetStream, the object store, the queue names of ``actors`` and the leader
lock of ``scheduling``. Readable at 80 columns.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import Any

import redis.asyncio as aioredis
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from actors.queues import ALL as QUEUES
from mailroom.adapters.redis_client import CLI_REDIS_ATTEMPTS, async_client, link_role
from mailroom.cli.status_links import jetstream_state, object_store_state
from mailroom.db.dsn import psycopg_dsn
from mailroom.db.engine import create_engine, create_sessionmaker
from mailroom.db.models import (
    PIPELINES,
    ChannelMessage,
    InboundMail,
    MailboxCursor,
    RecognitionJob,
    StoredFile,
)
from mailroom.delivery.status import stream_state
from mailroom.ops.attention import (
    NEEDS_OPERATOR,
    STAGES,
    format_age,
    needs_operator,
    oldest_per_stage,
)
from mailroom.recognition.contract.violations import CONTRACT_ERROR_CODES
from mailroom.recognition.gate import closed_gates, gate_lines
from mailroom.recognition.outbox.declared import undeclared_waiting
from mailroom.redaction import mask_urls
from mailroom.settings import Settings
from scheduling.leader import current_leader


async def collect_status(settings: Settings) -> dict[str, Any]:
    """Counts per status, what needs an operator, the oldest item per stage, every link."""
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
                    MailboxCursor.blocked_reason,
                    MailboxCursor.last_error,
                ).where(MailboxCursor.status == "blocked")
            )
            report["blocked_cursors"] = [
                {
                    "mailbox": m,
                    "folder": f,
                    "uid": uid,
                    "reason": reason,
                    "error": (err or "")[:200],
                    "unblock": f"mailroom intake unblock {m}",
                }
                for m, f, uid, reason, err in blocked.all()
            ]
            report["contract_violations"] = await _contract_violations(session)
            report["recognition_gate"] = await closed_gates(session)
            report["undeclared_types"] = [
                asdict(waiting)
                for waiting in await undeclared_waiting(session, settings.recognition, PIPELINES)
            ]
            # Final items waiting for a person; superseded attempts are history, not work.
            report["stopped"] = await needs_operator(session)
            report["oldest_s"] = await oldest_per_stage(session)
            # A standby answers reads too: after a failover, this says which one status reached.
            report["database_in_recovery"] = (
                await session.execute(select(func.pg_is_in_recovery()))
            ).scalar()
    finally:
        await engine.dispose()
    report.update(await _redis_status(settings))
    report["jetstream"] = await jetstream_state(settings)
    report["object_store"] = await object_store_state(settings)
    hosts = report.get("stream", {}).get("hosts", [])
    if settings.storage.kind == "filesystem" and len(hosts) > 1:
        report["object_store"]["warning"] = (
            f"the filesystem store serves one host, and stream bridges run on {len(hosts)} "
            f"({', '.join(hosts)}): use S3, or a folder every host mounts"
        )
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
    """Dramatiq's queues on the broker's Redis; the delivery stream on its own Redis."""
    report: dict[str, Any] = {"queues": {}, "stream": {}}
    broker = async_client(
        settings.broker_redis_url,
        settings.broker_redis,
        attempts=CLI_REDIS_ATTEMPTS,
        decode_responses=True,
    )
    namespace = settings.broker.namespace
    report["redis_links"] = {}
    try:
        report["redis_links"]["broker"] = await link_role(broker)
        for queue in QUEUES:
            report["queues"][queue] = {
                "ready": await broker.llen(f"{namespace}:{queue}"),
                "delayed": await broker.llen(f"{namespace}:{queue}.DQ"),
                # A message that failed after a delay is dead-lettered under the delay queue.
                "dead": await broker.zcard(f"{namespace}:{queue}.XQ")
                + await broker.zcard(f"{namespace}:{queue}.DQ.XQ"),
            }
    except aioredis.ConnectionError as exc:
        report["redis_error"] = str(exc)
    finally:
        await broker.aclose()
    stream = async_client(
        settings.stream_redis_url, settings.stream_redis, attempts=CLI_REDIS_ATTEMPTS
    )
    try:
        report["redis_links"]["stream"] = await link_role(stream)
        state = await stream_state(stream, settings.delivery)
        report["stream"] = {
            "key": settings.delivery.stream_key,
            "length": state.length,
            "pending": state.pending,
            "consumers": state.consumers,
            "group": settings.delivery.consumer_group if state.group_exists else None,
        }
        if state.group_exists:
            report["stream"]["hosts"] = await _bridge_hosts(stream, settings)
    except aioredis.ConnectionError as exc:
        report["stream_error"] = str(exc)
    finally:
        await stream.aclose()
    return report


async def _bridge_hosts(stream: aioredis.Redis, settings: Settings) -> list[str]:
    """The hosts of the delivery group's consumers (each named ``host-pid``)."""
    delivery = settings.delivery
    consumers = await stream.xinfo_consumers(delivery.stream_key, delivery.consumer_group)
    names = [c["name"].decode() if isinstance(c["name"], bytes) else c["name"] for c in consumers]
    return sorted({name.rpartition("-")[0] or name for name in names})


def _leader(settings: Settings) -> str | None:
    return current_leader(psycopg_dsn(settings.database), settings.scheduler.leader_lock_key)


def print_status(
    settings: Settings, *, as_json: bool = False, console: Console | None = None
) -> None:
    report = _masked(asyncio.run(collect_status(settings)))
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return
    console = console or Console()
    _print_work(report, console)
    _print_links(report, console)


def _masked(value: Any) -> Any:
    """The report with every URL's credentials masked (servers' errors quote their URLs)."""
    if isinstance(value, str):
        return mask_urls(value)
    if isinstance(value, dict):
        return {key: _masked(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(item) for item in value]
    return value


def _print_work(report: dict[str, Any], console: Console) -> None:
    counts = Table(title="Counts per status", box=box.SIMPLE_HEAD)
    counts.add_column("store")
    counts.add_column("status: count")
    for store in ("mails", "files", "jobs", "messages", "cursors"):
        cells = ", ".join(f"{status} {count}" for status, count in sorted(report[store].items()))
        counts.add_row(store, cells or "-")
    console.print(counts)
    for line in gate_lines(report["recognition_gate"]):
        console.print(line, style="bold red", markup=False)
    for waiting in report["undeclared_types"]:
        console.print(
            f"{waiting['files']} {waiting['pipeline']} file(s) of type {waiting['file_type']} "
            "wait: no recognition service declares it (recognition.file_types)",
            style="bold yellow",
            markup=False,
        )

    stopped = Table(title="Needs an operator (current items only)", box=box.SIMPLE_HEAD)
    stopped.add_column("item")
    stopped.add_column("count", justify="right")
    stopped.add_column("what to do")
    for name, count in report["stopped"].items():
        hint = NEEDS_OPERATOR.get(name, "") if count else ""
        stopped.add_row(name, str(count), hint, style="bold red" if count else None)
    console.print(stopped)

    oldest = Table(title="Oldest item per stage", box=box.SIMPLE_HEAD)
    oldest.add_column("stage")
    oldest.add_column("oldest", justify="right")
    oldest.add_column("what waits")
    for stage, seconds in report["oldest_s"].items():
        oldest.add_row(stage, format_age(seconds), STAGES[stage])
    console.print(oldest)

    if report["blocked_cursors"]:
        blocked = Table(title="Blocked mailboxes", box=box.SIMPLE_HEAD)
        for column in ("mailbox", "folder", "stopped at", "error", "after fixing it"):
            blocked.add_column(column)
        for row in report["blocked_cursors"]:
            blocked.add_row(
                escape(row["mailbox"]),
                escape(row["folder"]),
                row["reason"] or f"UID {row['uid']}",
                escape(row["error"]),
                escape(row["unblock"]),
            )
        console.print(blocked)
    if report["contract_violations"]:
        violations = Table(
            title="Answers off the contract (jobs ended as error)", box=box.SIMPLE_HEAD
        )
        for column in ("service", "code", "jobs", "last"):
            violations.add_column(column)
        for row in report["contract_violations"]:
            last = row["last"].strftime("%Y-%m-%d %H:%M") if row["last"] else ""
            violations.add_row(escape(row["service"]), row["code"], str(row["jobs"]), last)
        console.print(violations)


def _print_links(report: dict[str, Any], console: Console) -> None:
    queues = Table(title="Dramatiq queues", box=box.SIMPLE_HEAD)
    for column in ("queue", "ready", "delayed", "dead letters"):
        queues.add_column(column, justify="left" if column == "queue" else "right")
    for queue, depth in report["queues"].items():
        queues.add_row(queue, str(depth["ready"]), str(depth["delayed"]), str(depth["dead"]))
    console.print(queues)
    if "redis_error" in report:
        console.print(f"[red]broker Redis unavailable:[/] {escape(report['redis_error'])}")
    console.print(_stream_line(report))
    for link, state in report.get("redis_links", {}).items():
        console.print(_redis_link_line(link, state))
    console.print(_jetstream_line(report["jetstream"]))
    console.print(_object_store_line(report["object_store"]))
    console.print(f"scheduler leader: {escape(report['scheduler_leader'] or 'none')}")
    role = "a standby in recovery" if report.get("database_in_recovery") else "the primary"
    console.print(f"Postgres: connected to {role}")


def _stream_line(report: dict[str, Any]) -> str:
    if "stream_error" in report:
        return f"delivery stream: [red]Redis unavailable:[/] {escape(report['stream_error'])}"
    stream = report["stream"]
    group = stream["group"] or "not created yet"
    return (
        f"delivery stream {escape(stream['key'])}: {stream['length']} entries, "
        f"{stream['pending']} read and not acknowledged, {stream['consumers']} bridge(s) "
        f"(group {escape(group)})"
    )


def _redis_link_line(link: str, state: dict[str, Any]) -> str:
    """``Redis (broker): master at 10.0.0.2:6379, 1 replica(s), Sentinel master …``."""
    line = (
        f"Redis ({link}): {escape(state['role'])} at {escape(state['address'])}, "
        f"{state['replicas']} replica(s)"
    )
    if "master" in state:
        sentinels = ", ".join(state["sentinels"])
        line += f", Sentinel master {escape(state['master'])} (sentinels {escape(sentinels)})"
    return line


def _jetstream_line(state: dict[str, Any]) -> str:
    if not state["enabled"]:
        return "JetStream: off (core NATS: no stream to show)"
    name = escape(state["stream_name"])
    if "error" in state:
        return f"JetStream stream {name}: [red]{escape(state['error'])}[/]"
    stream = state["stream"]
    line = f"JetStream stream {name}: {stream['messages']} messages, {stream['bytes']} bytes"
    line += f", {stream['replicas']} replica(s)"
    if "leader" in stream:
        lagging = ", ".join(stream["lagging"]) or "none"
        line += f" (leader {escape(stream['leader'])}, lagging {escape(lagging)})"
    consumer = state.get("consumer")
    if consumer is None:
        return line + "; consumer not created yet (the NATS bridge creates it)"
    return line + (
        f"; consumer {escape(consumer['name'])}: {consumer['pending']} pending, "
        f"{consumer['ack_pending']} ack pending, {consumer['redelivered']} redelivered"
    )


def _object_store_line(state: dict[str, Any]) -> str:
    where = f"object store ({state['kind']}, {escape(state['where'])})"
    if state["reachable"]:
        note = f" ({escape(state['note'])})" if "note" in state else ""
        if "warning" in state:
            note += f" [yellow]warning: {escape(state['warning'])}[/]"
        return f"{where}: reachable{note}"
    return f"{where}: [red]unreachable:[/] {escape(state.get('error', ''))}"
