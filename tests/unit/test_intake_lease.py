"""The lease runner: the heartbeat renews, cancels only the work when the lease is lost,
and never turns an outside cancellation into anything else."""

from __future__ import annotations

import asyncio

import pytest

from mailroom.errors import LeaseLost, describe_error
from mailroom.intake.cursor_failures import backoff_s
from mailroom.intake.lease import run_under_lease


async def test_work_result_is_returned_and_the_lease_renewed_meanwhile():
    renewals = 0

    async def renew() -> bool:
        nonlocal renewals
        renewals += 1
        return True

    async def work() -> str:
        await asyncio.sleep(0.1)
        return "done"

    assert await run_under_lease(work(), renew=renew, interval_s=0.02) == "done"
    assert renewals >= 3
    await asyncio.sleep(0.05)
    stopped_at = renewals
    await asyncio.sleep(0.05)
    assert renewals == stopped_at, "the heartbeat stops with the work"


@pytest.mark.parametrize("failure", ["no row", "error", "hang"])
async def test_lost_renewal_cancels_the_work_and_raises_lease_lost(failure):
    cleaned_up = asyncio.Event()

    async def renew() -> bool:
        if failure == "error":
            raise ConnectionError("database gone")
        if failure == "hang":
            await asyncio.sleep(3600)
        return False

    async def work() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned_up.set()

    with pytest.raises(LeaseLost):
        await asyncio.wait_for(run_under_lease(work(), renew=renew, interval_s=0.02), 5)
    assert cleaned_up.is_set(), "the work ran its cleanup before we returned"


async def test_errors_of_the_work_propagate_unchanged():
    async def renew() -> bool:
        return True

    async def work() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await run_under_lease(work(), renew=renew, interval_s=0.02)


async def test_outside_cancellation_propagates_even_when_the_lease_is_lost_too():
    cleaned_up = asyncio.Event()
    lost = asyncio.Event()

    async def renew() -> bool:
        lost.set()
        return False

    async def work() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned_up.set()

    runner = asyncio.create_task(run_under_lease(work(), renew=renew, interval_s=10))
    await asyncio.sleep(0.05)
    runner.cancel()  # a worker shutdown
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert cleaned_up.is_set() and not lost.is_set()


def test_backoff_doubles_from_two_seconds_and_stops_at_the_cap():
    assert [backoff_s(n, max_backoff_s=300) for n in range(1, 11)] == [
        2,
        4,
        8,
        16,
        32,
        64,
        128,
        256,
        300,
        300,
    ]
    assert backoff_s(10_000, max_backoff_s=300) == 300


def test_database_errors_are_described_without_their_parameters():
    from sqlalchemy.exc import IntegrityError

    error = IntegrityError("INSERT …", {"subject": "secret subject"}, ValueError("duplicate key"))
    assert describe_error(error) == "ValueError: duplicate key"
    assert describe_error(KeyError("x")) == "KeyError: 'x'"
