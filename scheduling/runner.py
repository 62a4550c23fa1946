"""``mailroom scheduler``: APScheduler 3 running the job table while we lead."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import dramatiq.errors
import redis.exceptions
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from mailroom.db.dsn import psycopg_dsn
from mailroom.process.observability import active_sentry
from mailroom.process.outage import OutageLog
from mailroom.process.stop_signals import handle_stop_signals
from mailroom.redaction import mask_urls
from mailroom.settings import Settings
from scheduling import metrics
from scheduling.jobs import PeriodicJob, job_table
from scheduling.leader import LeaderElection

if TYPE_CHECKING:
    from mailroom.ops.gauges import WorkStateCollector

logger = logging.getLogger(__name__)


def monitor_slug(job_name: str) -> str:
    """The Sentry cron monitor a job checks in with: its name, in a slug's spelling."""
    return job_name.replace(":", "-").replace("_", "-")


#: What a send raises while the broker cannot be reached: an outage, told by ``OutageLog``.
BROKER_DOWN: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    dramatiq.errors.BrokerConnectionError,
    OSError,
)


def broker_outage(settings: Settings) -> OutageLog:
    """The scheduler's one line per change of the broker's reachability (password masked)."""
    where = mask_urls(settings.broker_redis_url)
    return OutageLog(f"Broker {where}", logger=logger, doing="the jobs send again at each tick")


def _run_job(job: PeriodicJob, outage: OutageLog | None = None) -> None:
    """Send the job's message and check in with its Sentry cron monitor (when Sentry is on)."""
    ok = True
    try:
        job.send()
        metrics.SENDS.labels(job.name, "sent").inc()
        if outage is not None:
            outage.recovered()
    except BROKER_DOWN as exc:
        metrics.SENDS.labels(job.name, "failed").inc()
        ok = False
        if outage is None:
            logger.error("Scheduler job %s could not send its message: %s", job.name, exc)
        else:
            outage.failed(f"job {job.name}: {type(exc).__name__}: {exc}", exc=exc)
    except Exception:
        metrics.SENDS.labels(job.name, "failed").inc()
        ok = False
        logger.exception("Scheduler job %s could not send its message", job.name)
    if active_sentry() is None:
        return
    from sentry_sdk.crons import MonitorStatus, capture_checkin

    status = MonitorStatus.OK if ok else MonitorStatus.ERROR
    capture_checkin(
        monitor_slug=monitor_slug(job.name),
        status=status,
        monitor_config={
            "schedule": {
                "type": "interval",
                "value": max(1, round(job.interval_s / 60)),
                "unit": "minute",
            },
            "checkin_margin": max(1, round(job.interval_s / 60)),
        },
    )


def build_scheduler(
    jobs: list[PeriodicJob], outage: OutageLog | None = None
) -> BackgroundScheduler:
    """A scheduler whose jobs run once at start (a new leader catches up) and then every interval."""
    scheduler = BackgroundScheduler(timezone=UTC)
    now = datetime.now(UTC)
    for job in jobs:
        scheduler.add_job(
            _run_job,
            IntervalTrigger(seconds=job.interval_s),
            args=[job, outage],
            id=job.name,
            name=job.name,
            next_run_time=now,
            coalesce=True,
            max_instances=1,
            misfire_grace_time=max(1, int(job.interval_s)),
        )
    return scheduler


class SchedulerService:
    """Leads when it can, runs the jobs while it leads, stands by otherwise."""

    def __init__(self, settings: Settings, *, election: LeaderElection | None = None) -> None:
        self.settings = settings
        self.election = election or LeaderElection(
            psycopg_dsn(settings.database),
            settings.scheduler.leader_lock_key,
            database=settings.database,
        )
        self.stopping = threading.Event()
        self.is_leader = threading.Event()
        self.outage = broker_outage(settings)

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        retry_s = self.settings.scheduler.leader_retry_s
        while not self.stopping.is_set():
            if not self.election.try_acquire():
                self.stopping.wait(retry_s)
                continue
            logger.info("Scheduler %s is the leader", self.election.name)
            self._lead(retry_s)
        self.election.release()

    def _lead(self, check_s: float) -> None:
        scheduler = build_scheduler(job_table(self.settings), self.outage)
        scheduler.start()
        self.is_leader.set()
        metrics.LEADER.set(1)
        try:
            while not self.stopping.wait(check_s):
                if not self.election.still_leader():
                    logger.warning("Scheduler %s lost leadership", self.election.name)
                    break
        finally:
            self.is_leader.clear()
            metrics.LEADER.set(0)
            scheduler.shutdown(wait=False)


def register_work_state(settings: Settings, service: SchedulerService) -> WorkStateCollector:
    """The work-state gauges, exported by the leading scheduler only (counted once)."""
    from prometheus_client import REGISTRY

    from mailroom.ops.gauges import WorkStateCollector

    dsn = psycopg_dsn(settings.database)
    collector = WorkStateCollector(dsn, active=service.is_leader.is_set)
    REGISTRY.register(collector)
    return collector


def run(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT; exit 0 (2 when Postgres or Redis refuse the login)."""
    from mailroom import queues as actor_names
    from mailroom.process.logins import EXIT_LOGIN_REFUSED, login_refusals
    from mailroom.process.observability import start_metrics_server

    refusals = login_refusals(settings)
    for refusal in refusals:
        logger.error("Scheduler cannot start: %s", refusal)
    if refusals:
        return EXIT_LOGIN_REFUSED

    # The jobs send by name: this process loads no actor module (actor_names.py).
    actor_names.only_send()
    from actors.broker.transport import set_sending_broker

    set_sending_broker(settings)

    service = SchedulerService(settings)
    if settings.metrics.port:
        register_work_state(settings, service)
    start_metrics_server(settings)

    handle_stop_signals(lambda *_: service.stop())
    service.run()
    return 0
