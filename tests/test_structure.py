"""The code's structure, checked statically (AST) over the runtime (protocol/, proxy/,
config/), the test harness (harness/: testbed/, pipeline/) and the PySpark data source
(spark/: mq_sidecar_spark/), each on its own:

* no import cycle between their modules, counting every import (``if TYPE_CHECKING:`` blocks
  and function bodies too): a cycle closed only by a type annotation still ties the modules
  together for a reader and for the next refactoring;
* the daemon (``mq-sidecar run``: ``proxy.__main__``, ``proxy.app``) never reaches the test
  harness (``testbed``, ``pipeline``, harness/), neither in its import graph nor when imported;
* the data source (a distribution of its own, installed into Spark images) reaches neither the
  daemon's packages nor the harness in its import graph (tests/spark/test_packaging.py checks
  its dependencies and what importing it loads);
* no module over :data:`MAX_LINES` lines;
* the daemon's rooms (the folders of ``proxy/`` and its top-level modules) import downhill
  only, in the order docs/architecture.md writes down once ("Rooms and their order").
"""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The runtime's packages (the wheel's), in the repository's root.
RUNTIME = ("protocol", "proxy", "config")
#: The test harness's packages (harness/, a distribution of its own): the daemon must never
#: import them.
HARNESS = ("testbed", "pipeline")
#: The PySpark data source's package (spark/, a distribution of its own): it imports neither
#: the runtime nor the harness.
SPARK = ("mq_sidecar_spark",)
#: The directory each package is in (its modules are named relative to it).
ROOTS = {
    **dict.fromkeys(RUNTIME, REPO),
    **dict.fromkeys(HARNESS, REPO / "harness"),
    **dict.fromkeys(SPARK, REPO / "spark"),
}
#: The groups checked each on its own for cycles and lengths.
GROUPS = {"runtime": RUNTIME, "harness": HARNESS, "spark": SPARK}
#: Modules the walk must find in each group at least (fewer: a wrong root, not a small group).
WALK_MINIMUM = {"runtime": 11, "harness": 11, "spark": 6}
#: Where the daemon's imports start: ``mq-sidecar run``.
DAEMON = ("proxy.__main__", "proxy.app")
#: Lines a module may have at most.
MAX_LINES = 600


@dataclass(frozen=True)
class Import:
    """One import statement's target as a module name, and where it is."""

    target: str
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules(packages: tuple[str, ...] = RUNTIME + HARNESS + SPARK) -> dict[str, Path]:
    """Every module of ``packages`` (subpackages included), by name; by default the
    runtime's, the harness's and the data source's."""
    found: dict[str, Path] = {}
    for package in packages:
        root = ROOTS[package]
        for path in sorted((root / package).rglob("*.py")):
            found[_module_name(path, root)] = path
    return found


def _resolve(name: str, importer: str, path: Path, level: int) -> str:
    """The absolute module name of ``from <level dots><name> import ...`` in ``importer``."""
    if level == 0:
        return name
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{name}" if name else package


@cache
def imports(name: str) -> tuple[Import, ...]:
    """What module ``name`` imports, anywhere in it, as module names: ``from X import Y`` is
    ``X.Y`` when that is a module of the runtime, the harness or the data source, else
    ``X``."""
    path = modules()[name]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(alias.name, path, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", name, path, node.level)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.append(Import(target if target in modules() else base, path, node.lineno))
    return tuple(found)


def graph(packages: tuple[str, ...]) -> dict[str, dict[str, Import]]:
    """Module of ``packages`` -> {module of ``packages`` it imports: the first import of it}."""
    group = modules(packages)
    out: dict[str, dict[str, Import]] = {}
    for name in group:
        edges: dict[str, Import] = {}
        for imp in imports(name):
            if imp.target in group and imp.target != name:
                edges.setdefault(imp.target, imp)
        out[name] = edges
    return out


def _shortest_path(edges: dict[str, dict[str, Import]], start: str, goal: str) -> list[str]:
    """The shortest import chain from ``start`` to ``goal`` (empty if there is none)."""
    previous: dict[str, str | None] = {start: None}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        if node == goal:
            chain = [node]
            while (back := previous[chain[-1]]) is not None:
                chain.append(back)
            return chain[::-1]
        for nxt in sorted(edges[node]):
            if nxt not in previous:
                previous[nxt] = node
                todo.append(nxt)
    return []


def find_cycles(edges: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Import cycles, each as ``[a, b, ..., a]`` starting at its smallest module: for every
    import edge that lies on a cycle, the shortest cycle through it (duplicates removed), so
    every edge that takes part in a cycle is shown in at least one."""
    cycles: dict[tuple[str, ...], list[str]] = {}
    for source in sorted(edges):
        for target in sorted(edges[source]):
            back = _shortest_path(edges, target, source)
            if not back:
                continue
            cycle = [source, *back]
            ring = cycle[:-1]
            turn = ring.index(min(ring))
            key = tuple(ring[turn:] + ring[:turn])
            cycles.setdefault(key, [*key, key[0]])
    return sorted(cycles.values(), key=lambda c: (len(c), c))


def _describe(cycle: list[str], edges: dict[str, dict[str, Import]]) -> str:
    steps = [f"    {a} -> {b}  ({edges[a][b].where()})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_no_import_cycle(group: str) -> None:
    edges = graph(GROUPS[group])
    cycles = find_cycles(edges)
    assert not cycles, f"{len(cycles)} import cycle(s) in the {group}:\n" + "\n".join(
        _describe(cycle, edges) for cycle in cycles
    )


def test_the_cycle_finder_finds_cycles() -> None:
    here = Path(__file__)
    edge = {name: Import(name, here, 1) for name in "abcd"}
    edges = {"a": {"b": edge["b"]}, "b": {"c": edge["c"]}, "c": {"a": edge["a"]}, "d": {}}
    assert find_cycles(edges) == [["a", "b", "c", "a"]]
    edges["b"]["a"] = edge["a"]
    assert find_cycles(edges) == [["a", "b", "a"], ["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b": edge["b"]}, "b": {}}) == []


def test_relative_imports_resolve_to_modules() -> None:
    targets = {imp.target for imp in imports("protocol")}
    assert "protocol._frame" in targets
    assert "protocol._connection" in targets


def test_the_daemon_does_not_reach_the_harness_statically() -> None:
    """Every module the daemon's modules import, transitively (all imports, lazy ones too)."""
    seen: dict[str, list[str]] = {start: [start] for start in DAEMON}
    todo = deque(DAEMON)
    reached: dict[str, None] = {}  # ordered, no duplicates
    while todo:
        name = todo.popleft()
        for imp in imports(name):
            if imp.target.partition(".")[0] in HARNESS:
                chain = " -> ".join([*seen[name], imp.target])
                reached[f"{chain}  ({imp.where()})"] = None
            elif imp.target in modules(RUNTIME) and imp.target not in seen:
                seen[imp.target] = [*seen[name], imp.target]
                todo.append(imp.target)
    assert len(seen) > 10, f"the walk found too little: {sorted(seen)}"
    assert not reached, "the daemon imports the test harness:\n" + "\n".join(reached)


def test_the_daemon_does_not_load_the_harness() -> None:
    check = (
        "import proxy.app, proxy.__main__, sys; "
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {HARNESS!r}); "
        "assert not loaded, loaded"
    )
    result = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_no_module_is_too_long(group: str) -> None:
    found = modules(GROUPS[group])
    assert len(found) >= WALK_MINIMUM[group], (
        f"the walk found too little of the {group}: {sorted(found)}"
    )
    lengths = {
        str(path.relative_to(REPO)): len(path.read_text().splitlines()) for path in found.values()
    }
    too_long = {path: n for path, n in sorted(lengths.items()) if n > MAX_LINES}
    assert not too_long, f"modules of the {group} over {MAX_LINES} lines: " + ", ".join(
        f"{path} ({n})" for path, n in too_long.items()
    )


#: The line of docs/architecture.md that gives the rooms' order.
ROOM_ORDER_LINE = re.compile(r"^rooms, bottom up: (?P<floors>.+)$", re.M)


def room_floors() -> dict[str, int]:
    """Room (``tracking``, ``app``, ``_errors``...) -> its floor (0 the lowest), as
    docs/architecture.md writes them: floors separated by ``|``, rooms as `` `name/` `` or
    `` `name.py` ``."""
    match = ROOM_ORDER_LINE.search((REPO / "docs" / "architecture.md").read_text())
    assert match is not None, "docs/architecture.md gives no line 'rooms, bottom up: ...'"
    floors: dict[str, int] = {}
    for level, floor in enumerate(match["floors"].split("|")):
        for name in re.findall(r"`([\w.]+?)(?:/|\.py)`", floor):
            floors[name] = level
    return floors


def room_of(module: str) -> str | None:
    """The daemon's room of ``module`` (``proxy.session.link`` -> ``session``, ``proxy.app`` ->
    ``app``), None outside ``proxy/`` or for ``proxy`` itself."""
    parts = module.split(".")
    if parts[0] != "proxy" or len(parts) == 1:
        return None
    return parts[1]


def test_every_room_of_the_daemon_has_a_floor() -> None:
    floors = room_floors()
    rooms = {room for name in modules(("proxy",)) if (room := room_of(name)) is not None}
    assert rooms == set(floors), (
        f"rooms without a floor: {sorted(rooms - set(floors))}; "
        f"floors of rooms that are gone: {sorted(set(floors) - rooms)}"
    )


def test_the_rooms_import_downhill() -> None:
    """An import from a room to a room on the same floor or above is an arrow back up."""
    floors = room_floors()
    edges = graph(RUNTIME)
    uphill = []
    for name, targets in sorted(edges.items()):
        here = room_of(name)
        if here is None:
            continue
        for target, imp in sorted(targets.items()):
            there = room_of(target)
            if there is None or there == here:
                continue
            if floors.get(there, -1) >= floors.get(here, -1):
                uphill.append(f"{here} -> {there}: {name} imports {target} ({imp.where()})")
    assert not uphill, "imports that do not run downhill:\n" + "\n".join(uphill)


def test_the_data_source_reaches_neither_the_daemon_nor_the_harness() -> None:
    """Every import of every module of spark/ (lazy ones too), by its top-level name."""
    found = modules(SPARK)
    assert len(found) >= WALK_MINIMUM["spark"], f"the walk found too little: {sorted(found)}"
    forbidden = set(RUNTIME + HARNESS)
    reached = [
        f"{name} -> {imp.target}  ({imp.where()})"
        for name in found
        for imp in imports(name)
        if imp.target.partition(".")[0] in forbidden
    ]
    assert not reached, "the data source imports the daemon or the harness:\n" + "\n".join(reached)
