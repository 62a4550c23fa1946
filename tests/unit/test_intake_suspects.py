"""The parse gate: a suspect mail is read while no other poll of the process parses."""

from __future__ import annotations

import asyncio

from mailroom.intake.suspects import ParseGate, parse_gate


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_suspect_waits_for_the_batches_in_progress_and_goes_before_new_ones() -> None:
    gate = ParseGate()
    order: list[str] = []
    first_batch_done = asyncio.Event()

    async def batch(name: str, until: asyncio.Event | None = None) -> None:
        async with gate.shared():
            order.append(f"{name} in")
            if until is not None:
                await until.wait()
            order.append(f"{name} out")

    async def suspect() -> None:
        async with gate.alone():
            order.append("suspect in")
            await asyncio.sleep(0)
            order.append("suspect out")

    running = asyncio.create_task(batch("first", first_batch_done))
    await _settle()
    waiting_suspect = asyncio.create_task(suspect())
    await _settle()
    later = asyncio.create_task(batch("later"))
    await _settle()
    assert order == ["first in"], "the suspect waits; a new batch waits behind it"

    first_batch_done.set()
    await asyncio.gather(running, waiting_suspect, later)
    assert order == ["first in", "first out", "suspect in", "suspect out", "later in", "later out"]


async def test_suspects_are_read_one_at_a_time() -> None:
    gate = ParseGate()
    inside = 0
    most = 0

    async def suspect() -> None:
        nonlocal inside, most
        async with gate.alone():
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.001)
            inside -= 1

    await asyncio.gather(*(suspect() for _ in range(5)))
    assert most == 1


async def test_a_cancelled_waiter_lets_the_others_in() -> None:
    gate = ParseGate()
    release = asyncio.Event()

    async def hold() -> None:
        async with gate.shared():
            await release.wait()

    holder = asyncio.create_task(hold())
    await _settle()
    suspect = asyncio.create_task(gate.alone().__aenter__())
    await _settle()
    suspect.cancel()
    await asyncio.gather(suspect, return_exceptions=True)
    # A batch is not kept waiting behind a suspect that is gone
    async with asyncio.timeout(1):
        async with gate.shared():
            pass
    release.set()
    await holder
    assert (gate.sharing, gate.alone_now, gate.waiting_alone) == (0, False, 0)


async def test_one_gate_per_event_loop() -> None:
    assert parse_gate() is parse_gate()
