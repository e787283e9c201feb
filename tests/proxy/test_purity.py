"""The session's pure modules stay pure, as protocol/ does (tests/protocol/test_sans_io.py):
no trio, no sockets, no clock. They take time as an argument, so tests drive them with any
clock and a session's records never mix two clocks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROXY = Path(__file__).parents[2] / "proxy"
#: Modules of proxy/ that must stay sans-I/O (the ruff TID251 ban covers them too).
PURE = [
    "tracking/__init__.py",
    "tracking/records.py",
    "tracking/state.py",
    "tracking/deliveries.py",
    "tracking/links.py",
    "tracking/window.py",
    "tracking/budget.py",
    "tracking/replay.py",
    "tracking/streams.py",
    "tracking/health.py",
    "reconnect/__init__.py",
    "reconnect/tally.py",
    "reconnect/policy.py",
    "reconnect/evacuations.py",
    "reconnect/brokers.py",
    "legs/__init__.py",
    "legs/dialect.py",
    "telemetry/__init__.py",
    "telemetry/vocabulary.py",
    "session/phase.py",
]
BANNED = {"trio", "socket", "time", "asyncio", "select", "threading", "selectors"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("name", PURE)
def test_pure_module_imports_nothing_that_does_io(name: str) -> None:
    path = PROXY / name
    for module in _imports(path):
        top = module.partition(".")[0]
        assert top not in BANNED, f"proxy/{name} imports {module}"
        if top == "proxy":
            # ...and only other pure modules of the sidecar.
            target = module.removeprefix("proxy.").replace(".", "/")
            assert f"{target}.py" in PURE or f"{target}/__init__.py" in PURE, (
                f"proxy/{name} imports {module}, which is not pure"
            )
