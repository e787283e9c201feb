"""A power cut in the middle of the WAL: the ``-wal`` file truncated at random points and with
a bit flipped at random points, for real, on copies of a live store's files.

What must hold every time: open() does not raise; what it recovers is a prefix of the
committed transactions, whole (never part of one); the report's own WAL scan agrees with what
SQLite kept; a flipped bit, which drops committed transactions, is reported as committed data
lost (a torn tail alone is not: it was never answered); and a second open finds a clean store
with the same frames (no crash loop)."""

from __future__ import annotations

import random
import shutil
import struct
from pathlib import Path

import pytest

from proxy.outbox import OutboxStore, RecoveryReport, scan_wal
from proxy.outbox.recovery import DB_NAME
from tests.outbox.helpers import frame

#: Transactions (batches) in the snapshot, and frames per batch.
BATCHES = 12
PER_BATCH = 3
#: Random points tried per mode; the seed makes every run the same.
POINTS = 25
SEED = 17
WAL_HEADER = 32
FRAME_HEADER = 24


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files of a store that committed BATCHES transactions, all still in its WAL, copied
    while it was open: what the disk holds when the power goes (synchronous=FULL: every
    commit is on disk when it returns)."""
    live = tmp_path_factory.mktemp("live")
    copy = tmp_path_factory.mktemp("snapshot")
    with OutboxStore.open(live, max_bytes=1 << 24) as store:
        for b in range(BATCHES):
            batch = [frame(b * PER_BATCH + i, size=700) for i in range(PER_BATCH)]
            store.append(f"s{b % 2}", batch)
        for name in (DB_NAME, f"{DB_NAME}-wal"):
            shutil.copyfile(live / name, copy / name)
    wal = scan_wal(copy / f"{DB_NAME}-wal")
    assert wal is not None
    assert (wal.transactions_kept, wal.frames_discarded, wal.torn_bytes) == (BATCHES, 0, 0)
    return copy


def _wal(snapshot: Path) -> tuple[bytes, int]:
    data = (snapshot / f"{DB_NAME}-wal").read_bytes()
    return data, FRAME_HEADER + struct.unpack(">I", data[8:12])[0]


def _recover(snapshot: Path, target: Path, wal: bytes) -> RecoveryReport:
    """Open a copy of ``snapshot`` whose WAL is ``wal``; check the invariants; return the
    first open's report."""
    target.mkdir()
    shutil.copyfile(snapshot / DB_NAME, target / DB_NAME)
    (target / f"{DB_NAME}-wal").write_bytes(wal)
    with OutboxStore.open(target, max_bytes=1 << 24) as store:
        report = store.recovery
        stored = sorted(
            (f for key in ("s0", "s1") for f in store.pending(key)), key=lambda f: f.seq
        )
    assert report.wal is not None
    kept = report.wal.transactions_kept if report.wal.header_valid else 0
    # what SQLite kept is whole transactions, a prefix, and what the scan says it kept
    assert [f.sidecar_id for f in stored] == [f"id-{n}" for n in range(kept * PER_BATCH)]
    assert report.frames == len(stored)
    assert report.damaged == ()
    assert not report.moved_aside
    with OutboxStore.open(target, max_bytes=1 << 24) as store:
        assert store.recovery.clean
        assert store.frames == len(stored)
    return report


def test_a_truncated_wal_keeps_the_transactions_before_the_cut(
    snapshot: Path, tmp_path: Path
) -> None:
    wal, _ = _wal(snapshot)
    rng = random.Random(SEED)
    cuts = sorted(rng.randrange(0, len(wal)) for _ in range(POINTS))
    previous = 0
    for n, cut in enumerate([*cuts, len(wal)]):
        report = _recover(snapshot, tmp_path / f"cut{n}", wal[:cut])
        assert report.wal is not None
        kept = report.wal.transactions_kept
        assert kept >= previous, "a longer file recovered less"
        previous = kept
        # a cut drops the transaction it tears, never a committed one before it
        assert not report.wal.lost_committed
        assert report.wal_lost == ()
        assert report.clean
    assert previous == BATCHES


def test_a_cut_in_the_last_frame_is_a_torn_tail_not_lost_committed_data(
    snapshot: Path, tmp_path: Path
) -> None:
    wal, frame_size = _wal(snapshot)
    cut = len(wal) - frame_size // 2
    report = _recover(snapshot, tmp_path / "torn", wal[:cut])
    assert report.wal is not None
    assert report.wal.transactions_kept == BATCHES - 1
    assert report.wal.torn_bytes == frame_size - frame_size // 2
    assert report.wal.frames_discarded >= 1  # the torn transaction's whole frames before it
    assert report.clean


def test_a_flipped_bit_in_the_wal_is_reported_and_never_breaks_open(
    snapshot: Path, tmp_path: Path
) -> None:
    wal, frame_size = _wal(snapshot)
    last_frame = (len(wal) - WAL_HEADER) // frame_size - 1
    rng = random.Random(SEED)
    for n in range(POINTS):
        at = rng.randrange(0, len(wal))
        damaged = bytearray(wal)
        damaged[at] ^= 1 << rng.randrange(8)
        report = _recover(snapshot, tmp_path / f"flip{n}", bytes(damaged))
        assert report.wal is not None
        # every byte is under a checksum or a salt compare: at least the last transaction goes
        assert report.frames < BATCHES * PER_BATCH, f"flip at {at} went unnoticed"
        offset = (at - WAL_HEADER) % frame_size
        in_last_salts = (
            at >= WAL_HEADER
            and (at - WAL_HEADER) // frame_size == last_frame
            and (8 <= offset < 16)
        )
        missing = [f"id-{n}" for n in range(report.frames, BATCHES * PER_BATCH)]
        if in_last_salts:  # that one looks like a torn tail: nothing tells them apart
            missing = missing[:-PER_BATCH]
        # every committed frame the damage took is named, and nothing else
        assert [f.sidecar_id for f in report.wal_lost] == missing, f"flip at {at}"
        if missing:
            assert report.wal.lost_committed
            assert any(f"{len(missing)} frame(s) in them lost" in p for p in report.problems())


def test_a_flip_in_the_wal_header_drops_the_whole_wal_and_says_so(
    snapshot: Path, tmp_path: Path
) -> None:
    wal, _ = _wal(snapshot)
    damaged = bytearray(wal)
    damaged[17] ^= 0x40  # salt-1, under the header's checksum
    report = _recover(snapshot, tmp_path / "header", bytes(damaged))
    assert report.wal is not None
    assert not report.wal.header_valid
    assert report.frames == 0
    assert len(report.wal_lost) == BATCHES * PER_BATCH
    assert "the WAL header itself is invalid" in report.problems()[0]


def test_frames_forwarded_inside_the_dropped_part_are_not_reported_lost(tmp_path: Path) -> None:
    live, copy = tmp_path / "live", tmp_path / "copy"
    copy.mkdir()
    with OutboxStore.open(live, max_bytes=1 << 24) as store:
        for b in range(6):
            store.append("s", [frame(b * PER_BATCH + i, size=700) for i in range(PER_BATCH)])
        store.remove("s", 4, 9)  # batches 1 and 2 forwarded and confirmed, in a 7th transaction
        for name in (DB_NAME, f"{DB_NAME}-wal"):
            shutil.copyfile(live / name, copy / name)
    wal, frame_size = _wal(copy)
    # flip a byte in the first page the second transaction wrote
    offset, commits = WAL_HEADER, 0
    while commits < 1:
        commits += 1 if struct.unpack(">I", wal[offset + 4 : offset + 8])[0] else 0
        offset += frame_size
    damaged = bytearray(wal)
    damaged[offset + FRAME_HEADER + 100] ^= 0xFF
    target = tmp_path / "flipped"
    target.mkdir()
    shutil.copyfile(copy / DB_NAME, target / DB_NAME)
    (target / f"{DB_NAME}-wal").write_bytes(bytes(damaged))
    with OutboxStore.open(target, max_bytes=1 << 24) as store:
        report = store.recovery
        assert [f.sidecar_id for f in store.pending("s")] == ["id-0", "id-1", "id-2"]
    assert report.wal is not None
    assert report.wal.transactions_discarded == 6
    # batches 3-5 were pending at the cut: lost; batches 1-2 had been removed: not lost
    assert [f.sidecar_id for f in report.wal_lost] == [f"id-{n}" for n in range(9, 18)]
