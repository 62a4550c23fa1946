"""Builds the worker's broker and its middleware from Settings (``set_broker`` is called in
``actors/__init__.py``, or ``actors.broker.transport`` in a process that only sends)."""

from __future__ import annotations

import logging
import os

import dramatiq
from dramatiq.middleware import (
    AgeLimit,
    AsyncIO,
    Callbacks,
    CurrentMessage,
    Pipelines,
    ShutdownNotifications,
    TimeLimit,
)

from actors.broker.transport import broker_for
from actors.middleware.dead_letters import DeadLetters
from actors.middleware.maintenance import RedisMaintenance
from actors.middleware.resources import ResourcesMiddleware
from actors.middleware.retry_policy import RetryPolicies, RetryPolicy
from actors.middleware.sentry_tags import SentryTags
from mailroom.process.observability import secret_values
from mailroom.settings import Settings

logger = logging.getLogger(__name__)


def build_middleware(settings: Settings) -> list[dramatiq.Middleware]:
    broker_settings = settings.broker
    middleware: list[dramatiq.Middleware] = [
        AgeLimit(),
        TimeLimit(),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        # Before RetryPolicies: ``after_*`` hooks run in reverse, so it sees the verdict.
        DeadLetters(secrets=secret_values(settings)),
        RetryPolicies(
            default=RetryPolicy(
                base_ms=broker_settings.retry_min_backoff_ms,
                cap_ms=broker_settings.retry_max_backoff_ms,
            )
        ),
        CurrentMessage(),
        SentryTags(),
        AsyncIO(),
        ResourcesMiddleware(settings),
    ]
    if broker_settings.kind == "redis":
        middleware.append(RedisMaintenance(interval_s=broker_settings.maintenance_interval_s))
    if broker_settings.prometheus:
        middleware.append(prometheus_middleware(settings))
    return middleware


def prometheus_middleware(settings: Settings) -> dramatiq.Middleware:
    """Dramatiq's exporter on ``broker.prometheus_host``/``_port``.

    The middleware takes no arguments: its module reads the address from the
    environment when it is first imported, so the settings go there first.
    """
    broker_settings = settings.broker
    wanted = {
        "dramatiq_prom_host": broker_settings.prometheus_host,
        "dramatiq_prom_port": str(broker_settings.prometheus_port),
    }
    os.environ.update(wanted)
    from dramatiq.middleware import prometheus

    serving = {
        "dramatiq_prom_host": prometheus.HTTP_HOST,
        "dramatiq_prom_port": str(prometheus.HTTP_PORT),
    }
    if serving != wanted:
        logger.warning(
            "The Prometheus exporter was imported before the settings applied; it serves on %s:%s",
            prometheus.HTTP_HOST,
            prometheus.HTTP_PORT,
        )
    return prometheus.Prometheus()


def build_broker(settings: Settings) -> dramatiq.Broker:
    """A broker for ``settings.broker.kind`` with Mailroom's middleware."""
    return broker_for(settings, build_middleware(settings))
