"""docs/architecture.md's map names every module of the product (protocol/, proxy/, config/),
and names none that is gone: the trees in its "The daemon, module by module" section are read
as paths (indentation gives the folder), ``__init__.py`` files aside. Each room of the daemon
(a folder of ``proxy/``) has a map of its own, its ``__init__.py`` docstring (``session/``'s is
:mod:`proxy.session.session`'s "where each rule lives"), which names every module of the room
as ````name````, and none that is gone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
PRODUCT = ("protocol", "proxy", "config")
_ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w.]+(?:/|\.py))(?:\s|$)")


def mapped_paths(text: str) -> set[str]:
    """Every path the map's code blocks name, as ``proxy/session/core.py``."""
    section = text.split("### The daemon, module by module", 1)[1].split("\n### ", 1)[0]
    paths: set[str] = set()
    for block in re.findall(r"```\n(.*?)```", section, flags=re.S):
        stack: list[tuple[int, str]] = []
        for line in block.splitlines():
            match = _ENTRY.match(line)
            if match is None:
                continue
            indent, name = len(match["indent"]), match["name"]
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = "".join(folder for _, folder in stack) + name
            if name.endswith("/"):
                stack.append((indent, name))
            else:
                paths.add(path)
    return paths


def product_modules() -> set[str]:
    return {
        str(path.relative_to(REPO))
        for package in PRODUCT
        for path in (REPO / package).rglob("*.py")
        if path.name != "__init__.py"
    }


def test_every_module_of_the_product_is_on_the_map() -> None:
    missing = product_modules() - mapped_paths(DOC.read_text())
    assert not missing, f"docs/architecture.md does not name: {sorted(missing)}"


def test_the_map_names_no_module_that_is_gone() -> None:
    stale = {p for p in mapped_paths(DOC.read_text()) if not p.endswith("__init__.py")}
    stale -= product_modules()
    assert not stale, f"docs/architecture.md names modules that do not exist: {sorted(stale)}"


def test_the_reader_follows_the_indentation() -> None:
    text = (
        "### The daemon, module by module\n"
        "```\nproxy/\n  a.py   x\n  b/\n    c.py  y\n  d.py\n```\n"
    )
    assert mapped_paths(text) == {"proxy/a.py", "proxy/b/c.py", "proxy/d.py"}


#: Where each room's map is: its ``__init__.py``, but for the session's (its main module's).
ROOM_MAPS = {"session": "session.py"}


def rooms() -> list[str]:
    """The folders of ``proxy/`` that hold Python modules (the daemon's rooms)."""
    return sorted(
        p.name for p in (REPO / "proxy").iterdir() if p.is_dir() and (p / "__init__.py").exists()
    )


def room_map(room: str) -> str:
    """The docstring that maps ``room``."""
    path = REPO / "proxy" / room / ROOM_MAPS.get(room, "__init__.py")
    return ast.get_docstring(ast.parse(path.read_text())) or ""


@pytest.mark.parametrize("room", rooms())
def test_every_room_map_names_every_module_of_the_room(room: str) -> None:
    modules = {p.stem for p in (REPO / "proxy" / room).glob("*.py") if p.name != "__init__.py"}
    named = set(re.findall(r"``(\w+)``", room_map(room)))
    missing = sorted(modules - named)
    assert not missing, f"proxy/{room}'s map does not name: {missing}"


@pytest.mark.parametrize("room", rooms())
def test_no_room_map_names_a_module_that_is_gone(room: str) -> None:
    """A name in the map's list (a line ``- ``name``:`` or ``; ``name``:``) is a module."""
    modules = {p.stem for p in (REPO / "proxy" / room).glob("*.py")}
    listed = set(re.findall(r"(?:^- |; |^  )``(\w+)``:", room_map(room), flags=re.M))
    gone = sorted(listed - modules)
    assert not gone, f"proxy/{room}'s map names modules that do not exist: {gone}"


def test_the_rooms_are_found() -> None:
    assert {"session", "legs", "tracking", "admin", "outbox"} <= set(rooms())
