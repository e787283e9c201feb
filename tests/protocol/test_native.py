"""Which build of the core runs (protocol/_native.py): the mypyc-compiled modules or their
sources, all or nothing, and the sources whenever a build is stale or ``MQ_SIDECAR_PURE`` is set
(docs/architecture.md, "The compiled core").

``scripts/test.sh`` sets ``EXPECT_MQ_SIDECAR_CORE`` to ``compiled`` for the whole suite and to
``pure`` for its pure-Python run, so a build that silently fell back cannot pass as compiled.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from protocol import _native

EXPECT_ENV = "EXPECT_MQ_SIDECAR_CORE"


def _is_extension(path: str | None) -> bool:
    return path is not None and any(path.endswith(suffix) for suffix in EXTENSION_SUFFIXES)


def test_the_expected_build_runs_all_or_nothing() -> None:
    expected = os.environ.get(EXPECT_ENV)
    if expected is not None:
        assert expected in ("compiled", "pure"), f"{EXPECT_ENV}={expected!r}"
        assert (expected == "compiled") == _native.COMPILED, _native.STATUS
    if _native.COMPILED:
        assert _native.MODULES, _native.STATUS
    for name in _native.MODULES:
        module = importlib.import_module(name)
        assert _is_extension(module.__file__) == _native.COMPILED, (name, module.__file__)


def _run(code: str, *, cwd: Path | None = None, pure: str | None = None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != _native.PURE_ENV}
    if pure is not None:
        env[_native.PURE_ENV] = pure
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=cwd,
        env=env,
    )
    return out.stdout.splitlines()


_SHOW = (
    "import protocol._native as n, protocol._parser as p, proxy.tracking.window as w\n"
    "print(n.STATUS)\nprint(p.__file__)\nprint(w.__file__)\n"
)


def test_mq_sidecar_pure_loads_every_module_from_its_source() -> None:
    status, parser, window = _run(_SHOW, pure="1")
    assert status in (
        "pure Python: MQ_SIDECAR_PURE=1",
        "pure Python: no compiled build (scripts/setup.sh builds one)",
    )
    assert parser.endswith("_parser.py")
    assert window.endswith("window.py")


@pytest.mark.skipif(not _native.COMPILED, reason="needs the compiled build (scripts/setup.sh)")
def test_a_source_changed_since_the_build_runs_pure(tmp_path: Path) -> None:
    """A copy of the built tree runs compiled; once one compiled source changes, all of them
    load from source, and the status names the file."""
    for package in ("protocol", "proxy", "config"):
        shutil.copytree(_native.ROOT / package, tmp_path / package)
    show = "import sys; sys.path.insert(0, '.')\n" + _SHOW
    status, parser, window = _run(show, cwd=tmp_path)
    assert status.startswith("compiled (mypyc)")
    assert parser.startswith(str(tmp_path))
    assert _is_extension(parser)
    assert _is_extension(window)
    with (tmp_path / "protocol" / "_parser.py").open("a") as source:
        source.write("\n# edited after the build\n")
    status, parser, window = _run(show, cwd=tmp_path)
    assert status == (
        "pure Python: protocol/_parser.py changed since the last build (scripts/setup.sh rebuilds)"
    )
    assert parser == str(tmp_path / "protocol" / "_parser.py")
    assert window == str(tmp_path / "proxy" / "tracking" / "window.py")


def _fake_build(root: Path, source: str = "x = 1\n") -> Path:
    """A manifest naming one compiled module, protocol/_m.py, with its 'extension'."""
    (root / "protocol").mkdir(exist_ok=True)
    (root / "protocol" / "_m.py").write_text(source)
    (root / "protocol" / f"_m{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    manifest = root / "protocol" / "_native.sha256"
    digest = hashlib.sha256(source.encode()).hexdigest()
    manifest.write_text(f"{digest}  protocol/_m.py\n")
    return manifest


def test_decide(tmp_path: Path) -> None:
    manifest = _fake_build(tmp_path)
    compiled = (True, "compiled (mypyc): 1 modules", ("protocol._m",))
    assert _native.decide({}, manifest) == compiled
    assert _native.decide({_native.PURE_ENV: "0"}, manifest) == compiled
    assert _native.decide({_native.PURE_ENV: ""}, manifest) == compiled
    assert _native.decide({_native.PURE_ENV: "1"}, manifest) == (
        False,
        "pure Python: MQ_SIDECAR_PURE=1",
        ("protocol._m",),
    )
    (tmp_path / "protocol" / "_m.py").write_text("x = 2\n")
    compiled_now, why, _ = _native.decide({}, manifest)
    assert not compiled_now
    assert "protocol/_m.py changed since the last build" in why
    manifest = _fake_build(tmp_path)
    (tmp_path / "protocol" / f"_m{EXTENSION_SUFFIXES[0]}").unlink()
    assert _native.decide({}, manifest)[:2] == (
        False,
        "pure Python: protocol/_m.py has no compiled module for this Python",
    )
    manifest.unlink()
    assert _native.decide({}, manifest) == (
        False,
        "pure Python: no compiled build (scripts/setup.sh builds one)",
        (),
    )
