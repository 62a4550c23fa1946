"""One stop request per Ctrl+C, however many copies of the signal arrive."""

from __future__ import annotations

import signal

from mailroom.process.stop_signals import StopHandler


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _handler(clock: _Clock) -> tuple[StopHandler, list[int], list[int]]:
    stops: list[int] = []
    kills: list[int] = []
    handler = StopHandler(
        lambda signum, frame: stops.append(signum),
        kill_code=3,
        window_s=2.0,
        kill=kills.append,
        clock=clock,
    )
    return handler, stops, kills


def test_copies_of_the_first_signal_within_the_window_are_one_stop():
    clock = _Clock()
    handler, stops, kills = _handler(clock)

    handler(signal.SIGTERM, None)
    clock.now += 0.3
    handler(signal.SIGTERM, None)
    clock.now += 1.0
    handler(signal.SIGINT, None)

    assert stops == [signal.SIGTERM]
    assert kills == []


def test_a_signal_after_the_window_exits_at_once():
    clock = _Clock()
    handler, stops, kills = _handler(clock)

    handler(signal.SIGINT, None)
    clock.now += 2.5
    handler(signal.SIGINT, None)

    assert stops == [signal.SIGINT]
    assert kills == [3]
