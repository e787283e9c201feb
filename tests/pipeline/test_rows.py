"""Message format, row identity and reconciliation: pure functions, no Spark, no broker."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from pipeline.rows import body_digest, message_id, row_key, serialise_row
from pipeline.verify import Received, reconcile


def test_serialise_row_handles_nulls_nan_timestamps_and_types() -> None:
    row = {
        "n": 1,
        "none": None,
        "nan": float("nan"),
        "inf": float("-inf"),
        "x": 2.5,
        "flag": True,
        "t": dt.datetime(2013, 1, 1, 5, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
        "day": dt.date(2013, 1, 1),
        "price": Decimal("1.10"),
        "name": "Zürich",
        "raw": b"\x00\xff",
        "tags": ["a", None],
        "nested": {"k": float("nan")},
    }
    body = serialise_row(row)
    assert body == (
        b'{"n":1,"none":null,"nan":null,"inf":null,"x":2.5,"flag":true,'
        b'"t":"2013-01-01T10:00:00Z","day":"2013-01-01","price":"1.10",'
        + '"name":"Zürich",'.encode()
        + b'"raw":"AP8=","tags":["a",null],"nested":{"k":null}}'
    )
    json.loads(body)  # valid JSON (no NaN literal)


def test_naive_timestamps_are_local_time_like_pyspark_gives_them() -> None:
    # PySpark turns TimestampType into a naive datetime in the local time zone.
    naive_local = dt.datetime.fromtimestamp(1357034400)  # 2013-01-01T10:00:00Z
    assert json.loads(serialise_row({"time_hour": naive_local})) == {
        "time_hour": "2013-01-01T10:00:00Z"
    }


def test_pyspark_rows_keep_their_column_order() -> None:
    from pyspark.sql import Row

    row = Row(year=2013, carrier="UA", tailnum=None)
    assert serialise_row(row) == b'{"year":2013,"carrier":"UA","tailnum":null}'


def test_serialise_row_refuses_values_without_a_json_form() -> None:
    with pytest.raises(TypeError, match="cannot serialise object"):
        serialise_row({"x": object()})


def test_message_ids_are_job_partition_and_row() -> None:
    assert message_id("flights", 1, "42") == "flights/1/42"
    assert message_id("flights", 0, "7", batch_id=3) == "flights/b3/0/7"
    assert row_key({"row": 42}, "row", ordinal=5) == "42"
    assert row_key({"row": 42}, None, ordinal=5) == "5"
    with pytest.raises(ValueError, match="key column 'row' is null in row 5"):
        row_key({"row": None}, "row", ordinal=5)


def test_body_digest_depends_on_content_only() -> None:
    assert body_digest(b'{"a":1}') == body_digest(b'{"a":1}')
    assert body_digest(b'{"a":1}') != body_digest(b'{"a":2}')
    assert len(body_digest(b"")) == 16


def _received(*messages: tuple[str | None, bytes]) -> Received:
    received = Received()
    for i, (mid, body) in enumerate(messages):
        received.record(mid, body_digest(body), float(i))
    return received


def test_reconcile_exactly_once_is_ok() -> None:
    source = {"j/0/1": body_digest(b"a"), "j/0/2": body_digest(b"b")}
    result = reconcile(source, _received(("j/0/2", b"b"), ("j/0/1", b"a")))
    assert result.ok
    assert (result.expected, result.received, result.unique, result.lost) == (2, 2, 2, 0)


def test_reconcile_names_lost_duplicated_mismatched_and_unexpected_ids() -> None:
    source = {f"j/0/{i}": body_digest(str(i).encode()) for i in range(1, 12)}
    received = _received(
        *((f"j/0/{i}", str(i).encode()) for i in range(1, 10) if i != 3),  # 3, 10, 11 lost
        ("j/0/2", b"2"),  # duplicate, same content
        ("j/0/2", b"2"),  # and again
        ("j/0/5", b"changed"),  # duplicate with other content
        ("j/0/9", b"9"),
        ("j/1/1", b"1"),  # not in the source
        (None, b"x"),  # no id at all
    )
    # j/0/4 arrives once with other content
    received.digests["j/0/4"] = body_digest(b"four")
    result = reconcile(source, received)
    assert not result.ok
    assert result.missing == ("j/0/3", "j/0/10", "j/0/11")  # numeric order
    assert dict(result.duplicated) == {"j/0/2": 2, "j/0/5": 1, "j/0/9": 1}
    assert (result.lost, result.duplicates) == (3, 4)
    assert result.mismatched == ("j/0/4", "j/0/5")
    assert result.unexpected == ("j/1/1",)
    assert result.anonymous == 1
    assert result.received == 8 + 4 + 2
    summary = result.to_dict(limit=1)
    assert summary["missing_ids"] == ["j/0/3"]
    assert summary["lost"] == 3


def test_received_merge_adds_copies_and_conflicts() -> None:
    first = _received(("j/0/1", b"a"), ("j/0/2", b"b"))
    second = _received(("j/0/2", b"other"), ("j/0/3", b"c"), (None, b""))
    first.merge(second)
    assert first.counts == {"j/0/1": 1, "j/0/2": 2, "j/0/3": 1}
    assert first.conflicts == {"j/0/2"}
    assert (first.anonymous, first.total) == (1, 5)
