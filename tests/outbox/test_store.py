"""OutboxStore: order, removal, the byte bound, atomic writes, depth, the persisted
duplicate-suppression ids, and recovery from damage in the database file itself (CRC32 of a
frame's bytes, a file that is no database, a b-tree page overwritten). The WAL's torn tail is
in test_torn_wal.py, the lock between processes in test_lock.py."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from proxy.outbox import (
    Append,
    Expire,
    Expired,
    OutboxError,
    OutboxFull,
    OutboxStore,
    RecordSeen,
    Remove,
    Removed,
)
from proxy.outbox.recovery import DB_NAME
from tests.outbox.helpers import FakeClock, frame


def test_appends_keep_the_order_per_session_and_a_global_sequence(tmp_path: Path) -> None:
    with OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        a1 = store.append("a", [frame(1), frame(2)])
        b1 = store.append("b", [frame(3)])
        a2 = store.append("a", [frame(4)])
        assert [f.seq for f in (*a1, *b1, *a2)] == [1, 2, 3, 4]
        assert [(f.session_order, f.sidecar_id) for f in store.pending("a")] == [
            (1, "id-1"),
            (2, "id-2"),
            (3, "id-4"),
        ]
        assert [f.frame for f in store.pending("b")] == [frame(3).frame]
        assert [f.sidecar_id for f in store.pending("a", after_seq=2, limit=5)] == ["id-4"]
        assert [(s.session_key, s.frames, s.first_seq) for s in store.backlog()] == [
            ("a", 3, 1),
            ("b", 1, 3),
        ]


def test_remove_takes_a_sequence_range_of_one_session_only(tmp_path: Path) -> None:
    with OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        store.append("a", [frame(1), frame(2)])
        store.append("b", [frame(3)])
        store.append("a", [frame(4)])
        removed = store.remove("a", 1, 3)
        assert removed == Removed(2, len(frame(1).frame) + len(frame(2).frame))
        assert [f.seq for f in store.pending("a")] == [4]
        assert [f.seq for f in store.pending("b")] == [3]
        assert store.remove("a", 1, 3) == Removed(0, 0)
        assert (store.frames, store.bytes) == (2, len(frame(3).frame) + len(frame(4).frame))


def test_order_and_sequence_continue_after_a_reopen_and_are_never_reused(tmp_path: Path) -> None:
    with OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        store.append("a", [frame(1), frame(2)])
        store.remove("a", 2, 2)  # the highest seq gone: AUTOINCREMENT still never reuses it
    with OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        assert store.recovery.clean
        assert (store.recovery.frames, store.recovery.sessions) == (1, 1)
        (stored,) = store.append("a", [frame(3)])
        assert (stored.seq, stored.session_order) == (3, 2)


def test_an_append_past_max_bytes_is_refused_whole_naming_the_option(tmp_path: Path) -> None:
    one = len(frame(1).frame)
    with OutboxStore.open(tmp_path, max_bytes=3 * one) as store:
        store.append("a", [frame(1), frame(2)])
        with pytest.raises(OutboxFull, match="outbox_max_bytes") as caught:
            store.append("a", [frame(3), frame(4)])
        assert (caught.value.needed, caught.value.used) == (2 * one, 2 * one)
        assert store.frames == 2
        # a Remove earlier in the same transaction makes room for the Append after it
        results = store.write([Remove("a", 1, 1), Append("a", (frame(3), frame(4)))])
        assert results[0] == Removed(1, one)
        assert store.bytes == 3 * one


def test_a_failed_write_stores_nothing_of_its_transaction(tmp_path: Path) -> None:
    one = len(frame(1).frame)
    with OutboxStore.open(tmp_path, max_bytes=2 * one) as store:
        with pytest.raises(OutboxFull):
            store.write(
                [
                    Append("a", (frame(1),)),
                    RecordSeen("/queue/orders", ("x",)),
                    Append("b", (frame(2), frame(3))),
                ]
            )
        assert (store.frames, store.bytes, store.backlog()) == (0, 0, ())
        assert store.seen_ids("/queue/orders") == ()
        (stored,) = store.append("a", [frame(1)])
        assert stored.session_order == 1  # the refused transaction's orders were not kept


def test_depth_counts_frames_bytes_sessions_and_the_oldest_frames_age(tmp_path: Path) -> None:
    clock = FakeClock()
    with OutboxStore.open(tmp_path, max_bytes=1 << 20, clock=clock) as store:
        empty = store.depth()
        assert (empty.frames, empty.bytes, empty.oldest_age) == (0, 0, None)
        store.append("a", [frame(1)])
        clock.now += 5.0
        store.append("b", [frame(2)])
        clock.now += 2.5
        depth = store.depth()
        assert (depth.frames, depth.sessions, depth.oldest_age) == (2, 2, 7.5)
        assert depth.bytes == len(frame(1).frame) + len(frame(2).frame)
        store.remove("a", 1, 1)
        assert store.depth().oldest_age == 2.5


def test_expire_takes_old_frames_no_reader_was_handed_oldest_first(tmp_path: Path) -> None:
    """outbox_max_age: frames older than the age go, oldest first, up to the limit; a frame a
    reader was handed (pending: a forwarder may have sent it) stays, old or not; the walk
    stops at the first young frame; counts and bytes follow."""
    clock = FakeClock()
    with OutboxStore.open(tmp_path, max_bytes=1 << 20, clock=clock) as store:
        store.append("a", [frame(1), frame(2)])
        store.append("b", [frame(3), frame(4), frame(5)])
        clock.now += 10.0
        store.append("b", [frame(6)])
        clock.now += 1.0
        assert [f.seq for f in store.pending("a", limit=1)] == [1]  # claimed
        (expired,) = store.write([Expire(5.0, 2)])
        assert isinstance(expired, Expired)
        assert [(f.seq, f.session_key, f.sidecar_id) for f in expired.frames] == [
            (2, "a", "id-2"),
            (3, "b", "id-3"),
        ]
        assert expired.bytes == len(frame(2).frame) + len(frame(3).frame)
        rest = store.expire(5.0, 100)
        assert [f.seq for f in rest.frames] == [4, 5]  # 6 is young: the walk stops there
        assert [f.seq for f in store.pending("a")] == [1]
        assert [f.seq for f in store.pending("b")] == [6]
        assert (store.frames, store.bytes) == (2, len(frame(1).frame) + len(frame(6).frame))
        assert store.expire(0.5, 100) == Expired((), 0)  # every frame left was handed out


def test_seen_ids_are_bounded_per_destination_by_count_and_age(tmp_path: Path) -> None:
    clock = FakeClock()
    with OutboxStore.open(tmp_path, max_bytes=1000, seen_max=10, seen_seconds=60, clock=clock) as s:
        s.record_seen("/queue/a", [f"a{i}" for i in range(25)])
        s.record_seen("/queue/b", ["b0"])
        assert s.seen_ids("/queue/a") == tuple(f"a{i}" for i in range(15, 25))
        # the table itself holds at most a tenth more than seen_max per destination
        stored = s.conn.execute("SELECT COUNT(*) FROM seen_ids WHERE destination='/queue/a'")
        assert stored.fetchone()[0] <= 11
        clock.now += 30
        s.record_seen("/queue/b", ["b1"])
        clock.now += 31
        assert s.seen_ids("/queue/b") == ("b1",)
        assert s.seen_destinations() == ("/queue/a", "/queue/b")
    with OutboxStore.open(tmp_path, max_bytes=1000, seen_max=10, seen_seconds=60, clock=clock) as s:
        assert s.seen_ids("/queue/b") == ("b1",)  # persisted across the restart
        assert s.seen_ids("/queue/a") == ()  # older than 60 s: dropped on open
        assert s.recovery.seen_ids == 1


def _flip_in_file(path: Path, needle: bytes) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0, f"{needle!r} not in {path.name}"
    data[at + 3] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_frame_whose_bytes_changed_on_disk_is_reported_and_the_rest_kept(tmp_path: Path) -> None:
    with OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        store.append("a", [frame(n, size=300) for n in range(1, 6)])
    # closed: SQLite checkpointed every frame into outbox.db; quick_check does not read BLOBs
    _flip_in_file(tmp_path / DB_NAME, b"<body 000003>")
    with OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        report = store.recovery
        assert report.integrity == ("ok",)
        assert [(d.seq, d.sidecar_id, d.reason) for d in report.damaged] == [
            (3, "id-3", "CRC32 mismatch")
        ]
        assert report.frames == 4
        assert "1 frame(s) failed their CRC32" in report.problems()[0]
        assert [f.sidecar_id for f in store.pending("a")] == ["id-1", "id-2", "id-4", "id-5"]
    with OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        assert store.recovery.clean  # reported once, then gone


def test_pending_skips_a_frame_damaged_while_running(tmp_path: Path) -> None:
    with OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        store.append("a", [frame(1), frame(2)])
        store.conn.execute("UPDATE frames SET frame = ? WHERE seq = 1", (b"garbage",))
        assert [f.seq for f in store.pending("a")] == [2]
        assert store.crc_failures == 1


def test_a_file_that_is_no_database_is_moved_aside_and_the_outbox_starts_empty(
    tmp_path: Path,
) -> None:
    (tmp_path / DB_NAME).write_bytes(b"this is not SQLite " * 300)
    with OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        report = store.recovery
        assert report.integrity[0].startswith("SQLITE_NOTADB")
        assert re.fullmatch(r"outbox-corrupt-\d{8}T\d{6}Z\.db", report.moved_aside[0].name)
        assert report.moved_aside[0].read_bytes().startswith(b"this is not SQLite")
        assert (report.frames, report.salvaged, report.lost) == (0, 0, None)
        assert "unknown number of frame(s) lost" in report.problems()[-1]
        store.append("a", [frame(1)])
    with OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:  # no crash loop
        assert store.recovery.clean
        assert store.frames == 1


def test_a_damaged_btree_is_moved_aside_with_what_can_be_read_salvaged(tmp_path: Path) -> None:
    with OutboxStore.open(tmp_path, max_bytes=1 << 22) as store:
        for n in range(200):
            store.append(f"s{n % 3}", [frame(n, size=900)])
    db = tmp_path / DB_NAME
    page_size = 4096
    data = bytearray(db.read_bytes())
    pages = len(data) // page_size
    # overwrite a page in the last third of the file (frames' leaf pages) with junk
    victim = pages * 2 // 3
    data[victim * page_size : (victim + 1) * page_size] = b"\xa5" * page_size
    db.write_bytes(bytes(data))
    with OutboxStore.open(tmp_path, max_bytes=1 << 22) as store:
        report = store.recovery
        assert report.integrity != ("ok",)
        assert report.moved_aside
        # only the frames on the damaged page are lost, not every frame after it
        assert 190 <= report.salvaged < 200
        assert report.lost == 200 - report.salvaged
        assert report.frames == report.salvaged - len(report.damaged)
        kept = [f.sidecar_id for key in ("s0", "s1", "s2") for f in store.pending(key)]
        assert len(kept) == report.frames
    with OutboxStore.open(tmp_path, max_bytes=1 << 22) as store:
        assert store.recovery.clean


def test_an_error_that_is_no_corruption_is_raised_and_moves_nothing(tmp_path: Path) -> None:
    with OutboxStore.open(tmp_path, max_bytes=1000) as store:
        store.append("a", [frame(1)])
    # a schema from a newer sidecar: refused as it is, never moved aside
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(OutboxError, match="newer than this sidecar"):
        OutboxStore.open(tmp_path, max_bytes=1000)
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == []
    # and the lock was released on the way out
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    with OutboxStore.open(tmp_path, max_bytes=1000) as store:
        assert store.frames == 1
