"""The drill's Spark options and the streaming consumer's bookkeeping, without Spark or brokers:
``--consumer``, ``--kill-driver-at``, ``--read-batch``, ``--master cluster``; the sidecar and
reader settings they imply; the residual check's split of the query's last batch; the sink's
committed files. ``test_drill.py`` runs ``drill --consumer spark`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.drill.options import (
    READ_PREFETCH_BATCHES,
    SPARK_UNACKED_FACTOR,
    DrillOptions,
    DrillUsageError,
)
from pipeline.drill.streaming import SparkConsumer
from pipeline.drill.transfer import split_residual
from pipeline.verify import Received


def test_spark_consumer_settings() -> None:
    options = DrillOptions(consumer="spark", read_batch=400)
    assert options.driver_kill_share() == 0.5
    assert options.read_prefetch() == READ_PREFETCH_BATCHES * 400
    consumer = options.sidecar_options("consumer", Path("/x"))
    assert consumer["max_unacked"] == SPARK_UNACKED_FACTOR * READ_PREFETCH_BATCHES * 400
    assert "max_unacked" not in options.sidecar_options("producer", Path("/x"))
    assert "max_unacked" not in DrillOptions().sidecar_options("consumer", Path("/x"))
    assert DrillOptions(consumer="spark", kill_driver_at=0.0).driver_kill_share() is None
    assert DrillOptions().driver_kill_share() is None, "no driver with the stomp.py reader"
    assert DrillOptions(master="cluster").cluster


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (DrillOptions(consumer="kafka"), "--consumer must be one of stomp, spark"),
        (DrillOptions(kill_driver_at=0.5), "--kill-driver-at only applies with --consumer spark"),
        (DrillOptions(consumer="spark", kill_driver_at=1.0), "a share below 1"),
        (DrillOptions(read_batch=0), "--read-batch must be at least 1"),
        (DrillOptions(master="yarn"), "--master must be local[...], spark://HOST:PORT or cluster"),
    ],
)
def test_bad_spark_options_are_refused(options: DrillOptions, problem: str) -> None:
    with pytest.raises(DrillUsageError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        options.validate()


def _received(ids: list[str]) -> Received:
    received = Received()
    for n, mid in enumerate(ids):
        received.record(mid, b"d" + mid.encode(), float(n))
    return received


def test_residual_split_by_the_sink_and_its_last_batch() -> None:
    """Left on the queue after the query stopped: its last batch (in the sink, not ACKed yet)
    apart, an earlier batch's message counted as an error, the rest left as always."""
    sink = _received(["j/1", "j/2", "j/3", "j/4"])
    left = _received(["j/3", "j/4", "j/1", "j/9"])
    kept, in_last, in_earlier = split_residual(left, sink, {"j/3", "j/4"})
    assert (in_last, in_earlier) == (2, 1)
    assert kept.counts == {"j/9": 1}
    assert kept.digests == {"j/9": b"dj/9"}
    assert kept.total == 1


def test_committed_files_follow_the_sink_metadata_log(tmp_path: Path) -> None:
    """Only files listed in the sink's ``_spark_metadata`` count (a killed batch's files are
    not); a later ``delete`` removes one."""
    meta = tmp_path / "consumer" / "sink" / "_spark_metadata"
    meta.mkdir(parents=True)

    def entry(path: str, action: str = "add") -> str:
        return json.dumps({"path": f"file://{path}", "action": action, "size": 1})

    (meta / "0").write_text("v1\n" + entry("/s/a.parquet") + "\n" + entry("/s/b.parquet"))
    (meta / "1").write_text("v1\n" + entry("/s/c.parquet") + "\n")
    (meta / "2").write_text("v1\n" + entry("/s/a.parquet", "delete") + "\n")
    (meta / ".2.crc").write_text("ignored")
    consumer = SparkConsumer(
        "/queue/x",
        host="127.0.0.1",
        port=1,
        workdir=tmp_path / "consumer",
        master="local[2]",
        conf={},
        rows=10,
        kill_at=None,
    )
    assert consumer._committed_files() == [Path("/s/b.parquet"), Path("/s/c.parquet")]
    assert consumer.unique == 0
    assert consumer.summary()["driver_kills"] == []
