"""Longer fuzz runs against a real sidecar and broker, with counts (issue 7).

Usage (from the repository root)::

    .venv/bin/python -m tests.fuzz.run --seconds 600 --seed 1
    .venv/bin/python -m tests.fuzz.run --seconds 600 --admin-seconds 120 --concurrency 12
    .venv/bin/python -m tests.fuzz.run --seed 1 --replay 1234     # print case 1234, play it alone
    .venv/bin/python -m tests.fuzz.run --seed 1 --replay 7 --admin  # the same for the admin port

It starts ActiveMQ (testbed, Debian package) and ``python -m proxy run`` on free loopback
ports in a temporary directory, runs the STOMP stream fuzzer of :mod:`tests.fuzz.driver` for
``--seconds`` (then, with ``--admin-seconds``, the admin-port fuzzer on a fresh sidecar), and
prints for each: inputs tried, crashes (the sidecar died, or logged a traceback or an ERROR
line), hangs (a connection the sidecar neither answered nor closed within its bound), wrong
answers, the well-behaved session's count and errors, leaked sessions/legs/sockets, RSS before
and after. Exit status 0 when every run is clean, 1 otherwise. The sidecar's log is kept when
a run fails (its path is printed).

The test suite runs the same code with small counts (``tests/fuzz/test_sidecar_fuzz.py``,
``tests/fuzz/test_admin_fuzz.py``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from testbed import ActiveMQ, activemq_installed
from testbed.sidecar import SidecarProcess
from tests.fuzz import streams
from tests.fuzz.driver import (
    FuzzReport,
    fuzz_sidecar,
    http_case_for,
    run_http_fuzz,
    run_stomp_fuzz,
    stomp_case_for,
)

__all__ = ["main"]


def _show(case: streams.Case) -> str:
    lines = [f"case {case.index}: kind {case.kind}, end {case.end}, fanout {case.fanout}"]
    lines.append(f"expect: {case.expect}")
    for part in case.parts:
        shown = part.data[:300]
        more = "..." if len(part.data) > 300 else ""
        times = f" x {part.repeat}" if part.repeat != 1 else ""
        lines.append(f"  send {shown!r}{more}{times}, then pause {part.pause:.3f} s")
    return "\n".join(lines)


def _replay(sidecar: SidecarProcess, case: streams.Case, *, http_mode: bool) -> int:
    import trio

    from tests.fuzz.driver import Tally, play

    tally = Tally()
    address = sidecar.admin_address if http_mode else sidecar.address

    async def main() -> None:
        await play(address, case, tally, http_mode=http_mode)

    trio.run(main)
    print(f"outcomes: {dict(tally.outcomes)}; hangs {tally.hangs}, wrong {tally.wrong}")
    for p in tally.problems:
        print(f"  problem: {p}")
    bad = sidecar.error_log_lines()
    for line in bad:
        print(f"  log: {line}")
    alive = sidecar.running()
    print(f"sidecar {'alive' if alive else 'DIED'}; log {sidecar.log_path}")
    return 0 if alive and not bad and not tally.hangs and not tally.wrong else 1


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run, print; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=__doc__)
    parser.add_argument("--seconds", type=float, default=600.0, help="STOMP fuzz time")
    parser.add_argument("--admin-seconds", type=float, default=0.0, help="admin fuzz time")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--heartbeats", type=int, default=1_000_000)
    parser.add_argument("--tiny-sends", type=int, default=50_000)
    parser.add_argument("--storm", type=int, default=100)
    parser.add_argument("--rss-margin-mib", type=float, default=30.0)
    parser.add_argument("--replay", type=int, default=None, help="play one case and exit")
    parser.add_argument("--admin", action="store_true", help="--replay an admin-port case")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a sidecar option (TOML value), e.g. max_frame_bytes=1048576",
    )
    args = parser.parse_args(argv)
    if not activemq_installed():
        print("ActiveMQ is not installed: run scripts/setup.sh", file=sys.stderr)
        return 2
    import tomllib

    options: dict[str, object] = {}
    for item in args.option:
        key, _, value = item.partition("=")
        options[key] = tomllib.loads(f"v = {value}")["v"]
    scale = streams.Scale(heartbeats=args.heartbeats, tiny_sends=args.tiny_sends, storm=args.storm)
    work = Path(tempfile.mkdtemp(prefix="mq-sidecar-fuzz-"))
    failed = False
    try:
        with ActiveMQ("fuzzamq", work / "activemq") as broker:
            print(f"ActiveMQ on {broker.stomp_url}; work directory {work}", flush=True)

            def sidecar(name: str) -> SidecarProcess:
                return fuzz_sidecar(name, work, brokers=broker.stomp_url, options=options)

            if args.replay is not None:
                with sidecar("replay") as sc:
                    if args.admin:
                        case = http_case_for(args.seed, args.replay)
                    else:
                        limits = streams.StompLimits(
                            handshake_timeout=int(sc.options["handshake_timeout"]) / 1000  # type: ignore[call-overload]
                        )
                        case = stomp_case_for(args.seed, args.replay, limits=limits, scale=scale)
                    print(_show(case), flush=True)
                    failed = _replay(sc, case, http_mode=args.admin) != 0
                return int(failed)
            reports: list[FuzzReport] = []
            if args.seconds > 0:
                with sidecar("stomp") as sc:
                    print(f"STOMP fuzz: sidecar pid {sc.pid} on {sc.address}", flush=True)
                    reports.append(
                        run_stomp_fuzz(
                            sc,
                            seed=args.seed,
                            seconds=args.seconds,
                            concurrency=args.concurrency,
                            scale=scale,
                            rss_margin_mib=args.rss_margin_mib,
                            progress=lambda line: print(line, flush=True),
                        )
                    )
                    print(reports[-1].text(), flush=True)
            if args.admin_seconds > 0:
                with sidecar("admin") as sc:
                    print(f"admin fuzz: sidecar pid {sc.pid} on {sc.admin_address}", flush=True)
                    reports.append(
                        run_http_fuzz(
                            sc,
                            seed=args.seed,
                            seconds=args.admin_seconds,
                            concurrency=max(2, args.concurrency // 2),
                            rss_margin_mib=args.rss_margin_mib,
                            progress=lambda line: print(line, flush=True),
                        )
                    )
                    print(reports[-1].text(), flush=True)
            failed = not all(r.ok for r in reports)
    finally:
        if failed:
            print(f"logs kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
