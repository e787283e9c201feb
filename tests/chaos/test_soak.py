"""The short chaos soak of the test suite (issue 7): the engine of ``tests/chaos/soak.py`` with
a fault phase of about 30 s, both broker systems at once, every fault kind injected at least
once on each (kill -9, SIGSTOP, blackhole, reset, slow link, mid-frame cut), then the
invariants checked from every message id. Longer soaks: ``python -m tests.chaos.soak``.

Known sidecar issues found by the soak are listed in ``KNOWN_ISSUES``: violations matching
them are printed but do not fail the test (the soak keeps exercising those paths, and any
other violation fails it); delete an entry once its bug is fixed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed import activemq_installed, rabbitmq_installed
from tests.chaos.soak import FAULT_KINDS, SoakOptions, Violation, run_soak

pytestmark = [pytest.mark.activemq, pytest.mark.rabbitmq]

#: (violation kind, regular expression searched in its detail, why it is known). Empty: the
#: soak's findings so far (an unreported ERROR cause, ACK order in ``client`` mode, a queue on
#: a closed leg) are fixed.
KNOWN_ISSUES: list[tuple[str, str, str]] = []
#: The suite's consumers: every ack mode.
SUITE_ACK_MODES = ("client-individual", "auto", "client")


def known(violation: Violation) -> str | None:
    """The reason a violation is a known issue, or None."""
    for kind, pattern, why in KNOWN_ISSUES:
        if violation.kind == kind and re.search(pattern, violation.detail):
            return why
    return None


def test_short_chaos_soak(tmp_path: Path) -> None:
    """Producers and consumers through sidecars against an ActiveMQ shared-store pair and a
    RabbitMQ node under every kind of fault: nothing confirmed is lost, nothing is delivered
    twice, every transaction is committed once or reported, every lost frame is reported."""
    if not (activemq_installed() and rabbitmq_installed()):
        pytest.fail("ActiveMQ and RabbitMQ are needed: run scripts/setup.sh", pytrace=False)
    options = SoakOptions(
        minutes=0.5,
        seed=20261121,
        gap=(0.5, 2.0),
        fault_seconds=(1.5, 4.5),
        ack_modes=SUITE_ACK_MODES,
        recovery_timeout=120.0,
        drain_timeout=90.0,
        workdir=tmp_path,
        json_path=tmp_path / "chaos-soak.json",
    )
    report = run_soak(options)
    print("\n" + report.summary())
    figures = report.figures
    for system in ("activemq", "rabbitmq"):
        injected = figures["faults"].get(system, {})
        assert set(injected) == set(FAULT_KINDS), f"{system}: {injected}"
    assert figures["messages"]["confirmed"] > 0
    assert figures["messages"]["received"] > 0
    assert figures["transactions"].get("committed", 0) > 0
    assert figures["events"]["FAILOVER"] > 0
    unexpected = [v for v in report.violations if known(v) is None]
    tolerated = [v for v in report.violations if known(v) is not None]
    for v in tolerated:
        print(f"known issue [{v.kind}] {v.detail}")
    assert not unexpected, "\n".join(f"[{v.kind}] at {v.at}s: {v.detail}" for v in unexpected)
