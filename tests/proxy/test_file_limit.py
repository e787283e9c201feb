"""The open-file limit at start (issue 34): the daemon raises its own soft ``RLIMIT_NOFILE``
to what ``max_sessions`` needs, up to the hard limit, or refuses to start naming both numbers
and the option. The same through ``mq-sidecar run``: tests/integration/test_admission.py."""

from __future__ import annotations

import resource

import pytest

from proxy.app import FILES_BESIDE_SESSIONS, FileLimitTooLow, fit_file_limit


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The process's (soft, hard) limits as a list the test sets; setrlimit calls append."""
    state: list[tuple[int, int]] = [(1024, 4096)]

    def getrlimit(which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return state[-1]

    def setrlimit(which: int, values: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        state.append(values)

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    return state


def test_a_soft_limit_below_what_max_sessions_needs_is_raised_up_to_the_hard_one(
    limits: list[tuple[int, int]],
) -> None:
    assert fit_file_limit(1000) == 2 * 1000 + FILES_BESIDE_SESSIONS
    assert limits[-1] == (2256, 4096)


def test_a_soft_limit_already_high_enough_is_left_alone(limits: list[tuple[int, int]]) -> None:
    limits[0] = (100_000, 100_000)
    assert fit_file_limit(5000) == 100_000
    limits[0] = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    assert fit_file_limit(5000) == resource.RLIM_INFINITY
    assert len(limits) == 1  # never set


def test_an_unlimited_hard_limit_lets_any_max_sessions_in(limits: list[tuple[int, int]]) -> None:
    limits[0] = (1024, resource.RLIM_INFINITY)
    assert fit_file_limit(50_000) == 100_256
    assert limits[-1] == (100_256, resource.RLIM_INFINITY)


def test_a_hard_limit_below_what_max_sessions_needs_refuses_the_start_naming_both(
    limits: list[tuple[int, int]],
) -> None:
    with pytest.raises(FileLimitTooLow) as info:
        fit_file_limit(5000)
    assert str(info.value) == (
        "max_sessions (5000) needs 10256 open files (two sockets per session and 256 for the "
        "rest), the open-file limit allows 4096 (RLIMIT_NOFILE, hard): lower max_sessions or "
        "raise the limit (ulimit -n, the container's nofile)"
    )
    assert len(limits) == 1
