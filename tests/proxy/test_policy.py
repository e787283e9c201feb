"""ReconnectPolicy: pure backoff arithmetic, limits and broker order (docs/architecture.md, "Pure
reconnect policy").

Every random draw comes from a seeded :class:`random.Random`, so delays are exact values.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config import Config, load_config
from proxy.reconnect.policy import ReconnectPolicy


def config(**overrides: str) -> Config:
    return load_config(path=None, env={}, overrides={"brokers": "stomp://127.0.0.1:1", **overrides})


# -- backoff ----------------------------------------------------------------------------------


def test_backoff_grows_by_the_multiplier_up_to_the_cap() -> None:
    policy = ReconnectPolicy(
        retry_interval=0.1, retry_interval_multiplier=2.0, max_retry_interval=1.0
    )
    assert [policy.backoff(n) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_backoff_with_multiplier_one_is_constant() -> None:
    policy = ReconnectPolicy(
        retry_interval=0.25, retry_interval_multiplier=1.0, max_retry_interval=5.0
    )
    assert {policy.backoff(n) for n in range(1, 50)} == {0.25}


@pytest.mark.parametrize("round_number", [0, -1])
def test_round_numbers_start_at_one(round_number: int) -> None:
    with pytest.raises(ValueError, match="round numbers start at 1"):
        ReconnectPolicy().backoff(round_number)


@pytest.mark.parametrize("round_number", [1_001, 10**6, 10**12])
def test_huge_round_numbers_do_not_overflow_with_the_default_multiplier(round_number: int) -> None:
    policy = ReconnectPolicy()  # multiplier 2.0
    assert policy.backoff(round_number) == policy.max_retry_interval
    assert 0.0 <= policy.delay(round_number, random.Random(1)) <= policy.max_retry_interval


@pytest.mark.parametrize(("multiplier", "round_number"), [(3.0, 700), (10.0, 310), (1e10, 40)])
def test_huge_round_numbers_do_not_overflow_with_a_large_multiplier(
    multiplier: float, round_number: int
) -> None:
    policy = ReconnectPolicy(retry_interval_multiplier=multiplier, max_retry_interval=5.0)
    assert policy.backoff(round_number) == 5.0


# -- delay and jitter --------------------------------------------------------------------------


def test_delay_with_a_seeded_rng_is_exact() -> None:
    policy = ReconnectPolicy()  # 0.1 s, x2, cap 5 s, full jitter
    rng = random.Random(42)
    assert [policy.delay(n, rng) for n in range(1, 8)] == [
        0.06394267984578837,
        0.005002151044533387,
        0.1100117273476477,
        0.1785685905190582,
        1.1783539426624199,
        2.1654383597533164,
        4.460897838524227,
    ]


def test_delay_is_backoff_minus_a_random_share_of_it() -> None:
    policy = ReconnectPolicy(jitter=0.5)
    rng, twin = random.Random(7), random.Random(7)
    for n in range(1, 12):
        base = policy.backoff(n)
        assert policy.delay(n, rng) == base * 0.5 + base * 0.5 * twin.random()


def test_zero_jitter_is_exactly_the_backoff_and_draws_nothing_random() -> None:
    policy = ReconnectPolicy(jitter=0.0)
    rng = random.Random(3)
    assert [policy.delay(n, rng) for n in range(1, 9)] == [policy.backoff(n) for n in range(1, 9)]


@pytest.mark.parametrize(("jitter", "low_share"), [(1.0, 0.0), (0.5, 0.5), (0.25, 0.75)])
def test_jitter_bounds(jitter: float, low_share: float) -> None:
    policy = ReconnectPolicy(retry_interval=1.0, retry_interval_multiplier=1.0, jitter=jitter)
    rng = random.Random(11)
    delays = [policy.delay(1, rng) for _ in range(2_000)]
    assert all(low_share <= d <= 1.0 for d in delays)
    # The draws spread over the whole interval (full jitter reaches near 0).
    assert min(delays) < low_share + 0.01
    assert max(delays) > 0.99


def test_delay_is_capped_by_max_retry_interval() -> None:
    policy = ReconnectPolicy(
        retry_interval=1.0, retry_interval_multiplier=3.0, max_retry_interval=2.0
    )
    rng = random.Random(5)
    assert all(policy.delay(n, rng) <= 2.0 for n in range(1, 200))


@given(
    retry=st.floats(min_value=0.001, max_value=10.0),
    multiplier=st.floats(min_value=1.0, max_value=2.0),
    cap_factor=st.floats(min_value=1.0, max_value=100.0),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    round_number=st.integers(min_value=1, max_value=10**6),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_delay_is_always_within_the_jitter_band(
    *,
    retry: float,
    multiplier: float,
    cap_factor: float,
    jitter: float,
    round_number: int,
    seed: int,
) -> None:
    policy = ReconnectPolicy(
        retry_interval=retry,
        retry_interval_multiplier=multiplier,
        max_retry_interval=retry * cap_factor,
        jitter=jitter,
    )
    base = policy.backoff(round_number)
    assert retry <= base or math.isclose(base, retry)
    assert base <= policy.max_retry_interval
    delay = policy.delay(round_number, random.Random(seed))
    slack = base * 1e-12  # float rounding only
    assert base * (1.0 - jitter) - slack <= delay <= base + slack


# -- exhausted --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "rounds_done", "expected"),
    [
        (-1, 0, False),
        (-1, 10**9, False),
        (3, 0, False),
        (3, 2, False),
        (3, 3, True),
        (3, 4, True),
        (1, 1, True),
    ],
)
@pytest.mark.parametrize("initial", [True, False])
def test_exhausted_counts_rounds_against_the_right_limit(
    limit: int, rounds_done: int, expected: bool, initial: bool
) -> None:
    other = 1 if limit == -1 else -1  # the limit of the other kind never matters
    policy = ReconnectPolicy(
        initial_connect_attempts=limit if initial else other,
        reconnect_attempts=other if initial else limit,
        reconnect_period=None,
    )
    assert policy.exhausted(rounds_done, 0.0, initial=initial) is expected
    # ... and the other limit is not consulted.
    assert policy.exhausted(rounds_done, 0.0, initial=not initial) is (
        other != -1 and rounds_done >= other
    )


def test_zero_reconnect_attempts_means_no_reconnect_at_all() -> None:
    policy = ReconnectPolicy(reconnect_attempts=0, reconnect_period=None)
    assert policy.exhausted(0, 0.0, initial=False)
    assert not policy.exhausted(0, 0.0, initial=True)


@pytest.mark.parametrize("initial", [True, False])
def test_reconnect_period_bounds_both_kinds(initial: bool) -> None:
    policy = ReconnectPolicy(
        reconnect_attempts=-1, initial_connect_attempts=-1, reconnect_period=2.5
    )
    assert not policy.exhausted(100, 2.4999, initial=initial)
    assert policy.exhausted(100, 2.5, initial=initial)
    assert policy.exhausted(0, 1000.0, initial=initial)


def test_no_reconnect_period_means_no_time_bound() -> None:
    policy = ReconnectPolicy(
        reconnect_attempts=-1, initial_connect_attempts=-1, reconnect_period=None
    )
    assert not policy.exhausted(10**6, 1e12, initial=False)
    assert not policy.exhausted(10**6, 1e12, initial=True)


# -- order ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("brokers", "current", "expected"),
    [
        (1, None, [0]),
        (1, 0, [0]),
        (3, None, [0, 1, 2]),
        (3, 0, [0, 1, 2]),
        (3, 1, [1, 2, 0]),
        (3, 2, [2, 0, 1]),
        (5, 3, [3, 4, 0, 1, 2]),
    ],
)
def test_order_is_current_first_then_round_robin(
    brokers: int, current: int | None, expected: list[int]
) -> None:
    rng = random.Random(0)
    state = rng.getstate()
    assert ReconnectPolicy().order(brokers, current, rng) == expected
    assert rng.getstate() == state  # no randomness used without randomize


@pytest.mark.parametrize("current", [0, 2, 4])
def test_randomize_shuffles_only_the_other_brokers(current: int) -> None:
    policy = ReconnectPolicy(randomize=True)
    orders = {tuple(policy.order(5, current, random.Random(seed))) for seed in range(200)}
    for order in orders:
        assert order[0] == current
        assert sorted(order) == [0, 1, 2, 3, 4]
    assert len(orders) > 1  # really shuffled
    assert len({order[1:] for order in orders}) == len(orders)


def test_randomize_with_a_seeded_rng_is_exact() -> None:
    policy = ReconnectPolicy(randomize=True)
    assert policy.order(5, 2, random.Random(3)) == [2, 1, 3, 0, 4]
    assert policy.order(5, None, random.Random(3)) == [0, 2, 3, 4, 1]


def test_randomize_shuffles_the_whole_list_on_a_first_connect() -> None:
    policy = ReconnectPolicy(randomize=True)
    orders = {tuple(policy.order(4, None, random.Random(seed))) for seed in range(200)}
    assert all(sorted(order) == [0, 1, 2, 3] for order in orders)
    assert {order[0] for order in orders} == {0, 1, 2, 3}


@pytest.mark.parametrize("brokers", [0, -1])
def test_order_needs_a_broker(brokers: int) -> None:
    with pytest.raises(ValueError, match="no brokers"):
        ReconnectPolicy().order(brokers, None, random.Random(0))


# -- from_config ------------------------------------------------------------------------------


def test_from_default_config_is_the_default_policy() -> None:
    assert ReconnectPolicy.from_config(config()) == ReconnectPolicy()


def test_from_config_converts_milliseconds_to_seconds() -> None:
    policy = ReconnectPolicy.from_config(
        config(
            retry_interval="250",
            retry_interval_multiplier="1.5",
            max_retry_interval="4000",
            reconnect_attempts="7",
            initial_connect_attempts="-1",
            reconnect_period="1500",
            jitter="0.25",
            randomize="true",
            priority_backup="true",
        )
    )
    assert policy == ReconnectPolicy(
        retry_interval=0.25,
        retry_interval_multiplier=1.5,
        max_retry_interval=4.0,
        reconnect_attempts=7,
        initial_connect_attempts=-1,
        reconnect_period=1.5,
        jitter=0.25,
        randomize=True,
        priority_backup=True,
    )


def test_from_config_reconnect_period_zero_means_unbounded() -> None:
    assert ReconnectPolicy.from_config(config(reconnect_period="0")).reconnect_period is None


def test_from_config_reads_activemq_aliases_in_the_failover_url() -> None:
    cfg = load_config(
        path=None,
        env={},
        overrides={
            "brokers": "failover:(stomp://127.0.0.1:1,stomp://127.0.0.1:2)"
            "?initialReconnectDelay=20&maxReconnectDelay=3000&backOffMultiplier=1.5"
        },
    )
    policy = ReconnectPolicy.from_config(cfg)
    assert (policy.retry_interval, policy.max_retry_interval) == (0.02, 3.0)
    assert policy.retry_interval_multiplier == 1.5


def test_policy_is_immutable_and_describes_itself() -> None:
    policy = ReconnectPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.jitter = 0.0  # type: ignore[misc]
    assert policy.describe() == {
        "retry_interval_s": 0.1,
        "retry_interval_multiplier": 2.0,
        "max_retry_interval_s": 5.0,
        "reconnect_attempts": -1,
        "initial_connect_attempts": 3,
        "reconnect_period_s": 300.0,
        "jitter": 1.0,
        "randomize": False,
        "priority_backup": False,
    }
