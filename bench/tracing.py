"""What tracing costs (issue 27 part 4): ``.venv/bin/python -m bench.tracing``.

One ActiveMQ (testbed, free loopback ports, a temporary directory) and four sidecar processes
in front of it, measured in the same run by the same load generator (``bench.loadgen``), the
repetitions taking turns in rotating order, the median of ``--reps`` reported:

- ``base``: the sidecar as it was before tracing (the source tree of ``--base``, default the
  merge base of HEAD and ``main``, exported with ``git archive``): what the data path cost
  "today";
- ``off``: this tree, ``tracing = false`` (the default): must cost what ``base`` does;
- ``on-none``: ``tracing = true`` with ``OTEL_TRACES_EXPORTER=none``: the spans made, not
  exported;
- ``on-otlp``: ``tracing = true`` exporting over OTLP/HTTP (the SDK's batch processor) to a
  receiver in this process on loopback, which answers 200 to every request and counts them.

Workloads (1 KiB bodies, non-persistent): ``send``: SENDs with a receipt each, 100 pipelined,
to a topic without subscribers (each SEND a span, ended by its RECEIPT); ``consume``: a
pre-filled queue consumed with ``client-individual`` ACKs (a ``receive`` and an ``ack`` span
per message). Reported per
message: wall microseconds, and the sidecar's CPU microseconds (all its threads, the exporter's
included: ``/proc/PID/task/*/schedstat``). Prints a table; ``--json`` writes the rows.

Never run as a timed test; about 3 minutes on a 2-core machine with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench import loadgen
from bench.procstat import run_ns
from bench.sidecar import SidecarProcess, broker_url
from testbed import ActiveMQ
from testbed.otlp import OtlpReceiver

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("base", "off", "on-none", "on-otlp")


class BaseSidecar(SidecarProcess):
    """A sidecar process running the source tree ``root`` (first on PYTHONPATH)."""

    def __init__(self, root: Path, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.root = root

    def _server_env(self) -> dict[str, str]:
        env = super()._server_env()
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), env.get("PYTHONPATH", "")])
        return env


def export_tree(rev: str, into: Path) -> Path:
    """The source tree of ``rev`` (``git archive``) in ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "protocol", "proxy", "config"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def start_variant(
    variant: str, url: str, vhost: str, workdir: Path, *, base: Path, sink_port: int
) -> SidecarProcess:
    """The sidecar process of ``variant`` (module docstring), ready."""
    env_keys = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_BSP_SCHEDULE_DELAY")
    for key in env_keys:
        os.environ.pop(key, None)
    options: dict[str, object] = {}
    if variant.startswith("on"):
        options["tracing"] = True
        if variant == "on-none":
            os.environ["OTEL_TRACES_EXPORTER"] = "none"
        else:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink_port}"
    sidecar: SidecarProcess
    if variant == "base":
        sidecar = BaseSidecar(base, url, workdir, options=options, vhost=vhost)
    else:
        sidecar = SidecarProcess(url, workdir, options=options, vhost=vhost)
    sidecar.start()
    for key in env_keys:
        os.environ.pop(key, None)
    return sidecar


def measure(
    sidecar: SidecarProcess, broker_port: int, vhost: str, workload: str, n: int
) -> dict[str, float]:
    """One run of ``workload`` through ``sidecar``: wall and sidecar CPU microseconds a
    message."""
    # SENDs go to a topic nobody subscribes to (the broker drops them: a queue would fill the
    # broker's memory run after run, and its producer flow control would stall the SENDs)
    kind = "queue" if workload == "consume" else "topic"
    dest = f"/{kind}/bench-tracing-{os.urandom(4).hex()}"
    if workload == "consume":
        loadgen.fill(broker_port, vhost, dest, n, persistent=False)
    client = loadgen.RawStomp(sidecar.port, vhost)
    try:
        cpu0 = run_ns(sidecar.pid)
        if workload == "send":
            m = loadgen.send_pipelined(client, dest, n, persistent=False)
        else:
            m = loadgen.consume(client, dest, n, ack="client-individual")
        cpu = run_ns(sidecar.pid) - cpu0
    finally:
        client.close()
    return {"wall_us": m.seconds / n * 1e6, "cpu_us": cpu / 1000 / n}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20_000, help="messages a run")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (median reported)")
    parser.add_argument("--base", default=None, help="revision of the 'base' sidecar")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    base_rev = (
        args.base
        or subprocess.run(
            ["git", "-C", str(REPO), "merge-base", "HEAD", "main"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        workdir = Path(tmp)
        base = export_tree(base_rev, workdir / "base-tree")
        with ActiveMQ("amq", workdir / "amq") as broker, OtlpReceiver(keep=False) as sink:
            sink_port = sink.port
            url = broker_url(broker.host, broker.stomp_port, broker.vhost)
            sidecars = {
                v: start_variant(v, url, broker.vhost, workdir, base=base, sink_port=sink_port)
                for v in VARIANTS
            }
            try:
                for workload in ("send", "consume"):
                    # warm-up: one short run each (imports, JIT-free but caches and broker)
                    for sidecar in sidecars.values():
                        measure(
                            sidecar, broker.stomp_port, broker.vhost, workload, min(2000, args.n)
                        )
                    for rep in range(args.reps):
                        order = VARIANTS[rep % 4 :] + VARIANTS[: rep % 4]
                        for variant in order:
                            row = measure(
                                sidecars[variant], broker.stomp_port, broker.vhost, workload, args.n
                            )
                            results.setdefault((workload, variant), []).append(row)
            finally:
                for sidecar in sidecars.values():
                    sidecar.stop()
            exports = sink.requests
    rows = []
    print(f"base = {base_rev[:12]}, n = {args.n}, median of {args.reps}; OTLP exports: {exports}")
    print(
        f"{'workload':<9} {'variant':<8} {'wall us/msg':>12} {'sidecar CPU us/msg':>19} "
        f"{'CPU vs off':>11}"
    )
    for workload in ("send", "consume"):
        off_cpu = statistics.median(r["cpu_us"] for r in results[(workload, "off")])
        for variant in VARIANTS:
            runs = results[(workload, variant)]
            wall = statistics.median(r["wall_us"] for r in runs)
            cpu = statistics.median(r["cpu_us"] for r in runs)
            rows.append(
                {
                    "workload": workload,
                    "variant": variant,
                    "wall_us": wall,
                    "cpu_us": cpu,
                    "runs": runs,
                }
            )
            print(f"{workload:<9} {variant:<8} {wall:12.1f} {cpu:19.1f} {cpu / off_cpu:10.2f}x")
    if args.json is not None:
        args.json.write_text(json.dumps({"base": base_rev, "n": args.n, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
