"""Smoke test of ``python -m bench.native``'s micro part: it runs both builds and writes the
promised JSON. No timing assertions (benchmarks are separate scripts): tiny counts, shape only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from protocol import _native

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not _native.COMPILED, reason="needs the compiled build (scripts/setup.sh)")
def test_native_micro_compares_both_builds(tmp_path: Path) -> None:
    out = tmp_path / "native.json"
    command = [sys.executable, "-m", "bench.native", "--micro-only", "--micro-reps=1"]
    subprocess.run(
        [*command, "--scale=0.01", f"--out={out}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    micro = json.loads(out.read_text())["micro"]
    assert micro["status"]["compiled"].startswith("compiled (mypyc)")
    assert micro["status"]["pure"] == "pure Python: MQ_SIDECAR_PURE=1"
    assert len(micro["rows"]) >= 7
    for row in micro["rows"]:
        assert row["compiled_ns"] > 0
        assert row["pure_ns"] > 0
        assert row["ratio"] > 0
