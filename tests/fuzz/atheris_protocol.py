"""Coverage-guided fuzzing of ``protocol/`` with atheris (libFuzzer for Python).

Run (from the repository root)::

    .venv/bin/python -m tests.fuzz.atheris_protocol -runs=20000
    .venv/bin/python -m tests.fuzz.atheris_protocol -max_total_time=300 [CORPUS_DIR ...]

Any libFuzzer flag works (``-runs``, ``-max_total_time``, ``-seed``, ``-timeout``,
``-artifact_prefix``...); a crashing input is written as ``crash-<sha1>`` into the repository
root unless ``-artifact_prefix`` says where. Without a corpus directory a temporary one is
seeded with valid and mutated STOMP sessions from :mod:`tests.fuzz.streams`; a STOMP
dictionary is always passed. The process prints one summary line at the end and exits 0
only when nothing crashed or hung::

    atheris: inputs tried 20000, crashes 0, hangs 0 (exit status 0, 14.2 s, ...)

How an input is read: byte 0 picks the target (the bare parser, a SERVER or a CLIENT
:class:`protocol.Connection`), the version (1.0/1.1/1.2), the limits (the sidecar's defaults,
tiny, medium) and where a Connection starts (fresh, or connected in 1.0/1.1/1.2); byte 1 picks
the chunk size (1..200 bytes, or whole); the rest is the bytes received. The checks are those
of :mod:`tests.fuzz.checks` (only RemoteProtocolError, bounded buffer, sticky errors, sendable
ERROR frames, roles, states); anything else raised is a crash, an input running longer than
``-timeout`` (default 10 s here) a hang.

The fuzzing runs in a child process (this module with ``MQ_SIDECAR_ATHERIS_CHILD=1``) because
libFuzzer ends the process with ``exit()`` when it is done, so only a parent can read its final
statistics and print the summary. ``protocol`` is imported inside
``atheris.instrument_imports()`` so its branches guide the fuzzer, from its sources
(``MQ_SIDECAR_PURE=1``: a compiled module has no bytecode to instrument).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

_CHILD_ENV = "MQ_SIDECAR_ATHERIS_CHILD"
_ROOT = Path(__file__).resolve().parents[2]


def _child() -> None:  # pragma: no cover - runs under libFuzzer in a subprocess
    import atheris

    with atheris.instrument_imports():
        import protocol

    from tests.fuzz import checks

    versions = protocol.VERSIONS
    limits = (
        protocol.Limits(),
        protocol.Limits(max_frame_bytes=256, max_headers=6, max_header_line_bytes=64),
        protocol.Limits(max_frame_bytes=4096, max_headers=40, max_header_line_bytes=512),
    )

    def test_one_input(data: bytes) -> None:
        if len(data) < 2:
            return
        mode, chunk = data[0], data[1]
        payload = data[2:]
        chunks = [chunk + 1] if chunk < 200 else [len(payload) or 1]
        target = mode % 3
        version = versions[(mode // 3) % 3]
        lim = limits[(mode // 9) % 3]
        prelude = checks.PRELUDES[(mode // 27) % 4]
        if target == 0:
            checks.run_parser(payload, version=version, limits=lim, chunks=chunks)
        else:
            role = protocol.Role.SERVER if target == 1 else protocol.Role.CLIENT
            checks.run_connection(payload, role=role, prelude=prelude, limits=lim, chunks=chunks)

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


def _mode(target: int, version: int, limits: int, prelude: int) -> int:
    return target + 3 * version + 9 * limits + 27 * prelude


def write_seeds(directory: Path, count: int = 60) -> int:
    """Seed ``directory`` with valid and mutated client/server sessions in every mode; returns
    the number of files written."""
    import random

    from tests.fuzz import streams

    written = 0
    for i in range(count):
        rng = random.Random(f"atheris-seed-{i}")
        version = i % 3
        target = i % 3
        if target == 2:
            data = streams.server_script(rng, version=("1.0", "1.1", "1.2")[version]).data
        else:
            data = streams.client_script(rng, version=("1.0", "1.1", "1.2")[version]).data
        if i % 2:
            data = streams.mutate(data, rng, 2)
        prelude = 0 if target != 0 and i % 4 else 1 + version
        mode = _mode(target, version, i % 3 if i % 5 == 0 else 0, prelude)
        chunk = rng.choice((0, 6, 99, 255))
        (directory / f"seed-{i:03d}").write_bytes(bytes((mode, chunk)) + data[:4000])
        written += 1
    return written


def write_dictionary(path: Path) -> None:
    """A libFuzzer dictionary of STOMP tokens (commands, headers, escapes, EOLs, NUL)."""
    from protocol import Command
    from tests.fuzz.streams import SPECIAL_TOKENS

    tokens = {*SPECIAL_TOKENS, *(c.value.encode() + b"\n" for c in Command)}
    tokens |= {
        b"version:1.1\n",
        b"message-id:",
        b"subscription:",
        b"receipt-id:",
        b"message:",
        b"content-type:",
        b"\n\n\x00",
    }
    lines = []
    for i, token in enumerate(sorted(tokens)):
        escaped = "".join(
            chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\x{b:02x}" for b in token
        )
        lines.append(f'kw{i}="{escaped}"')
    path.write_text("\n".join(lines) + "\n")


_STAT = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
_DONE = re.compile(r"Done (\d+) runs in")
_PROGRESS = re.compile(r"^#(\d+)\s", re.MULTILINE)


def summarize(output: str, status: int, seconds: float) -> tuple[int, int, int, str]:
    """(inputs tried, crashes, hangs, summary line) from libFuzzer's output and exit status."""
    tried = 0
    for pattern in (_STAT, _DONE):
        found = pattern.findall(output)
        if found:
            tried = int(found[-1])
            break
    else:
        progress = _PROGRESS.findall(output)
        tried = int(progress[-1]) if progress else 0
    hangs = int("libFuzzer: timeout" in output)
    crashes = 0
    if status != 0 and not hangs:
        crashes = 1  # libFuzzer stops at the first crash (an exception, a signal, an OOM)
    cov = re.findall(r"cov: (\d+) ft: (\d+)", output)
    coverage = f", cov {cov[-1][0]} ft {cov[-1][1]}" if cov else ""
    artifacts = re.findall(r"Test unit written to (\S+)", output)
    where = f", artifact {artifacts[-1]}" if artifacts else ""
    line = (
        f"atheris: inputs tried {tried}, crashes {crashes}, hangs {hangs} "
        f"(exit status {status}, {seconds:.1f} s{coverage}{where})"
    )
    return tried, crashes, hangs, line


def main(argv: list[str]) -> int:
    """Run the child fuzzer with ``argv`` (libFuzzer flags and corpus dirs); print the summary.

    Returns 0 when the run ended without a crash or a hang, else 1.
    """
    flags = [a for a in argv if a.startswith("-")]
    corpora = [a for a in argv if not a.startswith("-")]
    with tempfile.TemporaryDirectory(prefix="mq-sidecar-atheris-") as tmp:
        seeds = Path(tmp) / "seeds"
        seeds.mkdir()
        write_seeds(seeds)
        dictionary = Path(tmp) / "stomp.dict"
        write_dictionary(dictionary)
        extra = ["-print_final_stats=1", f"-dict={dictionary}"]
        if not any(f.startswith("-timeout=") for f in flags):
            extra.append("-timeout=10")
        command = [sys.executable, "-m", "tests.fuzz.atheris_protocol", *flags, *extra]
        command += [*corpora, str(seeds)] if corpora else [str(Path(tmp) / "corpus"), str(seeds)]
        (Path(tmp) / "corpus").mkdir()
        # The pure-Python build: atheris instruments Python bytecode, and a compiled module
        # has none (docs/architecture.md, "The compiled core").
        env = {**os.environ, _CHILD_ENV: "1", "MQ_SIDECAR_PURE": "1"}
        started = time.monotonic()
        proc = subprocess.Popen(
            command,
            cwd=_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None
        chunks: list[str] = []
        for line in proc.stdout:
            sys.stdout.write(line)
            chunks.append(line)
        status = proc.wait()
        output = "".join(chunks)
        _, crashes, hangs, summary = summarize(output, status, time.monotonic() - started)
    print(summary, flush=True)
    return 0 if status == 0 and not crashes and not hangs else 1


if __name__ == "__main__":
    if os.environ.get(_CHILD_ENV) == "1":
        _child()
    else:
        sys.exit(main(sys.argv[1:]))
