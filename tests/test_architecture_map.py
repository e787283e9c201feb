"""docs/architecture.md's map names every module of the product (protocol/, proxy/, config/),
and names none that is gone: the trees in its "The daemon, module by module" section are read
as paths (indentation gives the folder), ``__init__.py`` files aside (each package's map is its
own docstring)."""

from __future__ import annotations

import re
from pathlib import Path

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
