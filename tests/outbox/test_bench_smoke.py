"""``python -m bench.outbox`` runs end to end and prints every table (a smoke run with tiny
slices; the numbers themselves are the benchmark's business, never asserted here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import outbox


def test_the_outbox_benchmark_prints_its_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert outbox.main(["--seconds", "0.02", "--rounds", "1", "--dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    for heading in ("## Batches", "## SQLite over the floor", "## Group commit", "## Disk bytes"):
        assert heading in text
    for batch in outbox.BATCHES:
        assert f"| SQLite WAL, synchronous=FULL | {batch} |" in text
    assert list(tmp_path.iterdir()) == []  # its temporary directory is gone
