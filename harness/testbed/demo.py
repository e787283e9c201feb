"""``mq-sidecar demo``: a local ActiveMQ (Debian package) with mq-sidecar in front of it.

Registered with the runtime's command line through the ``mq_sidecar.commands`` entry-point
group (harness/pyproject.toml); the sidecar runs in this process, as ``mq-sidecar run`` does.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from proxy.__main__ import load_or_exit, run_sidecar
from testbed.activemq import ActiveMQ, activemq_installed

__all__ = ["demo"]


@click.command()
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
    if not activemq_installed():
        click.echo("mq-sidecar: ActiveMQ is not installed; run scripts/setup.sh first", err=True)
        sys.exit(1)
    with tempfile.TemporaryDirectory(prefix="mq-sidecar-demo-") as tmp:
        base = workdir or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        broker = ActiveMQ("demo", base / "activemq")
        click.echo(f"starting ActiveMQ (log: {broker.log_path}) ...")
        with broker:
            config = load_or_exit(
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
            run_sidecar(config)
