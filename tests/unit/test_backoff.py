"""The one backoff formula: doubling from a base up to a cap, with optional jitter."""

from __future__ import annotations

import random

from mailroom.backoff import backoff


def test_wait_doubles_from_the_base_until_the_cap():
    waits = [backoff(n, base=1.0, cap=30.0) for n in range(8)]
    assert waits == [1, 2, 4, 8, 16, 30, 30, 30]


def test_base_and_cap_keep_the_callers_unit():
    assert backoff(0, base=1_000, cap=300_000) == 1_000
    assert backoff(3, base=1_000, cap=300_000) == 8_000
    assert backoff(20, base=1_000, cap=300_000) == 300_000


def test_a_runaway_attempt_count_stays_at_the_cap():
    assert backoff(10_000, base=0.1, cap=10.0) == 10.0
    assert backoff(10**9, base=1, cap=300) == 300


def test_without_jitter_no_random_number_is_drawn():
    rng = random.Random(7)
    state = rng.getstate()
    assert backoff(2, base=1.0, cap=60.0, rng=rng) == 4.0
    assert rng.getstate() == state


def test_jitter_adds_up_to_its_fraction_of_the_wait():
    rng = random.Random(1)
    waits = [backoff(3, base=1.0, cap=60.0, jitter=0.5, rng=rng) for _ in range(200)]
    assert all(8.0 <= w <= 12.0 for w in waits)
    assert len(set(waits)) > 100


def test_jitter_is_drawn_from_the_given_generator():
    first = backoff(4, base=2.0, cap=60.0, jitter=0.5, rng=random.Random(42))
    again = backoff(4, base=2.0, cap=60.0, jitter=0.5, rng=random.Random(42))
    assert first == again == 32.0 + random.Random(42).uniform(0, 16.0)


def test_jitter_applies_on_top_of_the_cap():
    rng = random.Random(3)
    waits = [backoff(30, base=1.0, cap=10.0, jitter=0.5, rng=rng) for _ in range(50)]
    assert all(10.0 <= w <= 15.0 for w in waits)
