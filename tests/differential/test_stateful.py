"""Stateful differential testing: hypothesis scenarios (:mod:`tests.differential.machine`)
run against each broker directly and through an in-process sidecar, in lockstep.

CI mode (the default): a fixed, derandomized set of :data:`EXAMPLES` scenarios of at most
:data:`STEPS` steps per broker, no example database, so every run tries the same scenarios
in bounded time. Known differences (tests/differential/known.py, each with its regression
test in test_regressions.py) end an example's comparison; any other difference fails, with
the shrunk scenario printed as a list of actions ready for a regression test.

Longer mode: ``MQ_SIDECAR_DIFFERENTIAL_EXAMPLES=500`` (any count) runs that many randomized
examples per broker, with ``MQ_SIDECAR_DIFFERENTIAL_STEPS`` steps at most (default 25),
e.g. ``MQ_SIDECAR_DIFFERENTIAL_EXAMPLES=500 .venv/bin/python -m pytest
tests/differential/test_stateful.py -p no:cacheprovider``; expect about 2 s per example.
``MQ_SIDECAR_DIFFERENTIAL_SURVEY=1`` prints new differences (with their scenario) instead of
failing, so that one run lists them all (run with ``-s``);
``MQ_SIDECAR_DIFFERENTIAL_VERBOSE=1`` prints every example's actions and differences.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.differential.machine import machine_for
from tests.differential.runner import Lab

pytestmark = pytest.mark.differential

#: Scenarios per broker in CI.
EXAMPLES = 12
#: Steps per scenario in CI.
STEPS = 10

_LONG = os.environ.get("MQ_SIDECAR_DIFFERENTIAL_EXAMPLES")


def _settings() -> settings:
    common = {
        "deadline": None,
        "suppress_health_check": list(HealthCheck),
        "database": None,
        "report_multiple_bugs": False,
    }
    if os.environ.get("MQ_SIDECAR_DIFFERENTIAL_SURVEY"):
        common["phases"] = [Phase.generate]
    if _LONG:
        steps = int(os.environ.get("MQ_SIDECAR_DIFFERENTIAL_STEPS", "25"))
        return settings(max_examples=int(_LONG), stateful_step_count=steps, **common)  # type: ignore[arg-type]
    return settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        derandomize=True,
        **common,  # type: ignore[arg-type]
    )


def test_activemq_stateful(amq_lab: Lab) -> None:
    run_state_machine_as_test(machine_for(amq_lab), settings=_settings())


def test_rabbitmq_stateful(rmq_lab: Lab) -> None:
    run_state_machine_as_test(machine_for(rmq_lab), settings=_settings())
