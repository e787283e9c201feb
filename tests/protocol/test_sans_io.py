"""protocol/ stays sans-I/O: standard library only, and nothing that does I/O or reads a clock."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import protocol

PACKAGE = Path(protocol.__file__).parent
BANNED = {"trio", "socket", "time", "asyncio", "select", "threading"}


def _imported_modules(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.append(node.module)
    return modules


def test_only_stdlib_and_no_io_modules() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 8
    for path in files:
        for module in _imported_modules(path):
            top = module.partition(".")[0]
            assert top not in BANNED, f"{path.name} imports {module}"
            assert top == "__future__" or top in sys.stdlib_module_names, (
                f"{path.name} imports non-stdlib module {module}"
            )


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(out.stdout.split())


def test_import_pulls_in_no_io_modules() -> None:
    """Importing protocol loads none of the banned modules beyond a bare start
    (docs/architecture.md, "The protocol layer does no I/O")."""
    added = _loaded_after("import protocol") - _loaded_after("pass")
    assert "protocol" in added
    assert not added & BANNED


def _docstrings() -> dict[str, str | None]:
    """The docstring of every top-level function and class of protocol/, from the sources: a
    compiled build drops them at run time (docs/architecture.md, "The compiled core")."""
    found: dict[str, str | None] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                found[node.name] = ast.get_docstring(node)
    return found


def test_public_api() -> None:
    assert isinstance(protocol.__all__, tuple)
    docstrings = _docstrings()
    for name in protocol.__all__:
        obj = getattr(protocol, name)
        if callable(obj) and not isinstance(obj, frozenset):
            assert docstrings.get(name), f"{name} has no docstring"
    assert set(protocol.__all__) == {n for n in dir(protocol) if not n.startswith("_")} - {
        "annotations"
    }
