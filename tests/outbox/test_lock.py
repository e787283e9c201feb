"""Two sidecar processes never open one ``outbox_dir`` at once: real processes, real flock.

The holder is a child Python process that opens the store and waits on its stdin; the test
process is the second sidecar. Every wait on the child is bounded (``timeout=``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from proxy.outbox import DirectoryLock, OutboxLocked, OutboxStore

REPO = Path(__file__).resolve().parents[2]
#: Opens the store in argv[1], says "ready <pid>", holds it until stdin closes.
HOLDER = """
import sys
from pathlib import Path
from proxy.outbox import OutboxLocked, OutboxStore
try:
    store = OutboxStore.open(Path(sys.argv[1]), max_bytes=1000)
except OutboxLocked as exc:
    print("locked", exc, flush=True)
    sys.exit(3)
print("ready", flush=True)
sys.stdin.read()
store.close()
"""
WAIT = 20.0  # seconds at most for the child to start or end


@contextmanager
def holder(directory: Path) -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=WAIT)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def _first_line(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    return child.stdout.readline().strip()


def test_a_second_process_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    with holder(tmp_path) as child:
        assert _first_line(child) == "ready"
        with pytest.raises(OutboxLocked) as caught:
            OutboxStore.open(tmp_path, max_bytes=1000)
        assert caught.value.pid == child.pid
        assert f"in use by process {child.pid}" in str(caught.value)
        assert "two sidecars cannot share one outbox_dir" in str(caught.value)


def test_the_holder_refuses_a_second_process_too(tmp_path: Path) -> None:
    with OutboxStore.open(tmp_path, max_bytes=1000), holder(tmp_path) as child:
        line = _first_line(child)
        assert child.wait(timeout=WAIT) == 3
        assert line.startswith("locked")
        assert f"process {os.getpid()}" in line


def test_kill_9_of_the_holder_frees_the_directory(tmp_path: Path) -> None:
    with holder(tmp_path) as child:
        assert _first_line(child) == "ready"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=WAIT) == -signal.SIGKILL
        with OutboxStore.open(tmp_path, max_bytes=1000) as store:
            assert store.recovery.clean


def test_a_closed_store_frees_the_directory_for_the_next(tmp_path: Path) -> None:
    with holder(tmp_path) as child:
        assert _first_line(child) == "ready"
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(timeout=WAIT) == 0
    OutboxStore.open(tmp_path, max_bytes=1000).close()


def test_two_locks_in_one_process_conflict_as_well(tmp_path: Path) -> None:
    first = DirectoryLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(OutboxLocked) as caught:
            DirectoryLock(tmp_path).acquire()
        assert caught.value.pid == os.getpid()
    finally:
        first.release()
    assert not first.held
