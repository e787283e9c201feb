"""The streaming reader's read log and options, on real files (no broker, no Spark): what a
restarted driver finds in the log, how damage and other versions are refused, and the bound on
the committed identities (docs/spark.md, "Streaming read")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mq_sidecar_spark._read_log import VERSION, LogRecord, ReadLog, ReadLogError
from mq_sidecar_spark._read_options import parse_read_options
from mq_sidecar_spark.errors import OptionError

DEST = "/queue/log"


def records(start: int, count: int) -> list[LogRecord]:
    """``count`` records numbered from ``start + 1``, identity ``m:<seq>``, binary bodies."""
    return [
        LogRecord(
            seq=seq,
            identity=f"m:{seq}",
            destination=DEST,
            message_id=f"ID:{seq}",
            duplicate_id=None,
            headers={"row-id": str(seq), "ünïcode": "välue"},
            body=bytes([seq % 256, 0, 255]) * 3,
            timestamp_ms=1795734480871 + seq,
            redelivered=seq % 2 == 0,
        )
        for seq in range(start + 1, start + count + 1)
    ]


def open_log(path: Path, id_cache_size: int = 100) -> ReadLog:
    return ReadLog(path, destination=DEST, id_cache_size=id_cache_size)


def test_a_reopened_log_gives_back_the_same_records_and_remembers_commits(
    tmp_path: Path,
) -> None:
    """What a restarted driver sees: uncommitted batches byte for byte, their identities, the
    committed ones by identity only, their batch files gone."""
    log = open_log(tmp_path)
    assert log.append(records(0, 5)) == 5
    assert log.append(records(5, 3)) == 8
    assert log.commit(5) == [1, 2, 3, 4, 5]
    again = open_log(tmp_path)
    assert (again.committed_seq, again.end_seq) == (5, 8)
    assert again.read(5, 8) == records(5, 3)
    assert again.batch_end_after(5) == 8
    assert again.uncommitted_seq("m:7") == 7
    assert again.is_committed("m:3")
    assert not again.is_committed("m:7")
    assert [p.name for p in tmp_path.glob("batch-*")] == ["batch-000000000005-000000000008.log"]
    with pytest.raises(ReadLogError, match="holds only those after 5"):
        again.read(2, 8)
    with pytest.raises(ReadLogError, match="ends at 8"):
        again.read(5, 9)


def test_a_torn_commit_is_not_a_commit_and_a_damaged_file_is_refused(tmp_path: Path) -> None:
    """A crash mid-append leaves a partial last line: ignored (Spark commits again). A batch
    file whose CRC does not match is refused with its path."""
    log = open_log(tmp_path)
    log.append(records(0, 4))
    log.commit(2)
    log.append(records(4, 2))
    with (tmp_path / "committed.log").open("ab") as out:
        out.write(b'{"end":4,"ids":["m:3"')
    again = open_log(tmp_path)
    assert again.committed_seq == 2
    assert again.read(2, 6) == records(2, 4)
    again.commit(4)
    assert open_log(tmp_path).committed_seq == 4  # the next commit is a line of its own
    batch = tmp_path / "batch-000000000004-000000000006.log"
    data = bytearray(batch.read_bytes())
    data[-10] ^= 0xFF
    batch.write_bytes(bytes(data))
    with pytest.raises(ReadLogError, match="CRC mismatch"):
        open_log(tmp_path)


def test_another_version_or_destination_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(records(0, 1))
    with pytest.raises(ReadLogError, match="log of destination '/queue/log', not '/queue/y'"):
        ReadLog(tmp_path, destination="/queue/y", id_cache_size=10)
    committed = tmp_path / "committed.log"
    lines = committed.read_text().splitlines()
    header = json.loads(lines[0])
    header["version"] = VERSION + 1
    committed.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(ReadLogError, match=f"format version {VERSION + 1}; .* reads version"):
        open_log(tmp_path)


def test_committed_identities_are_bounded_on_disk_and_in_memory(tmp_path: Path) -> None:
    """With ``id_cache_size`` 100, 30 commits of 20 keep the newest 100 identities, and the
    file is rewritten before it holds more than 200."""
    log = open_log(tmp_path, id_cache_size=100)
    for n in range(30):
        log.append(records(n * 20, 20))
        log.commit((n + 1) * 20)
        lines = (tmp_path / "committed.log").read_text().splitlines()[1:]
        assert sum(len(json.loads(line)["ids"]) for line in lines) <= 200
    again = open_log(tmp_path, id_cache_size=100)
    assert again.committed_seq == 600
    assert again.is_committed("m:600")
    assert again.is_committed("m:501")
    assert not again.is_committed("m:500")
    assert list(tmp_path.glob("batch-*")) == []


def test_read_options_are_checked_and_case_insensitive(tmp_path: Path) -> None:
    options = parse_read_options(
        {
            "Destination": "/queue/a b",
            "CHECKPOINT_LOCATION": f"file:{tmp_path}",
            "max_messages_per_batch": "100",
            "subscription_headers": '{"selector": "x > 1"}',
        }
    )
    assert options.prefetch == 10000
    assert options.subscription_headers == {"selector": "x > 1"}
    assert options.log_directory == tmp_path / "sources" / "mq-sidecar-stomp" / "%2Fqueue%2Fa%20b"
    base = {"destination": "/queue/a", "checkpoint_location": str(tmp_path)}
    bad = [
        ({"checkpoint_location": "hdfs://nn/x"}, "not hdfs://"),
        ({"subscription_headers": '{"ack": "auto"}'}, "sets ack: the reader sets"),
        ({"subscription_headers": "[1]"}, "must be a JSON object of strings"),
        ({"port": "70000"}, "must be 1-65535"),
        ({"max_bytes_per_batch": "-1"}, "must be at least 1"),
    ]
    for change, message in bad:
        with pytest.raises(OptionError, match=message):
            parse_read_options({**base, **change})
