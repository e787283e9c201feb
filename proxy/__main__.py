"""``mq-sidecar`` command line (click): ``run``, ``check-config``, ``--version``, plus the
commands other installed distributions register under the ``mq_sidecar.commands`` entry-point
group (the test harness, ``harness/``: ``demo`` and ``drill``).

Option names are stable: scripts and the Helm chart use them. Every flag overrides the same
option from ``MQ_SIDECAR_*`` environment variables and the TOML file (``--config`` or
``MQ_SIDECAR_CONFIG``). Bad configuration exits with status 2 and one line per problem.

The daemon does not depend on the harness: a registered command is imported only when it is
named (or listed by ``--help``), never by ``run``; without the harness, ``demo`` and ``drill``
exit 1 with one line saying so.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import click
import trio

from config import Config, ConfigError, load_config
from proxy._version import VERSION
from proxy.admin.http import TokenUnavailable, read_token
from proxy.app import (
    FileLimitTooLow,
    ListenError,
    NoBrokers,
    OutboxUnusable,
    TracingUnavailable,
    serve,
)
from proxy.legs.memory import keep_mmap_threshold, tune_garbage_collector
from proxy.legs.tls import TlsFailed, client_context
from proxy.telemetry.logs import configure_logging

__all__ = [
    "COMMAND_GROUP",
    "HARNESS_COMMANDS",
    "load_or_exit",
    "main",
    "run_sidecar",
    "unusable_files",
]

F = TypeVar("F", bound=Callable[..., object])

#: Entry-point group through which other distributions add commands (``name = "module:cmd"``,
#: the object a ``click.Command``).
COMMAND_GROUP = "mq_sidecar.commands"
#: Commands the test harness (distribution ``mq-sidecar-harness``) provides.
HARNESS_COMMANDS = ("demo", "drill")


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


def load_or_exit(config_path: Path | None, overrides: Mapping[str, object | None]) -> Config:
    """Load the configuration or exit 2 with one line per problem."""
    try:
        return load_config(path=config_path, overrides=overrides)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(f"mq-sidecar: {problem}", err=True)
        sys.exit(2)


def unusable_files(config: Config) -> list[str]:
    """One line per file option that cannot be used now: the ``admin_token_file``, and the TLS
    files (``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``, ``tls_key_password_file``:
    one client context is built as a connect would). The daemon reads them again at every
    request and every connect (a rotated Secret applies without a restart); this is the
    start-up check that a typo in a path ends the start, not every connect."""
    problems: list[str] = []
    if config.admin_token_file is not None:
        try:
            read_token(config.admin_token_file)
        except TokenUnavailable as unreadable:
            problems.append(str(unreadable))
    tls = next((b for b in config.brokers if b.tls), None)
    if tls is not None:
        try:
            client_context(tls, config)
        except TlsFailed as failed:
            problems.append(str(failed))
    return problems


def run_sidecar(config: Config, reload_config: Callable[[], Config] | None = None) -> None:
    """Run the daemon with ``config`` until SIGTERM/SIGINT; exit 1 if it cannot listen, a
    file it is given cannot be used (:func:`unusable_files`), its ``outbox_dir`` cannot
    (another sidecar holds it, or it cannot be written), ``tracing = true`` cannot start
    (:class:`~proxy.app.TracingUnavailable`), the open-file limit cannot hold ``max_sessions``
    (:class:`~proxy.app.FileLimitTooLow`), or no broker is found at start (DNS names that
    do not resolve, an empty brokers file). SIGHUP loads the configuration again with
    ``reload_config`` (:mod:`proxy.reload`)."""
    configure_logging(config.log_level, config.log_format)
    problems = unusable_files(config)
    for problem in problems:
        click.echo(f"mq-sidecar: {problem}", err=True)
    if problems:
        sys.exit(1)
    keep_mmap_threshold()  # RSS follows what the memory budget counts
    tune_garbage_collector()  # no full collections over thousands of sessions
    try:
        trio.run(lambda: serve(config, handle_signals=True, reload_config=reload_config))
    except* (ListenError, OutboxUnusable, TracingUnavailable, NoBrokers, FileLimitTooLow) as group:
        for exc in group.exceptions:
            click.echo(f"mq-sidecar: {exc}", err=True)
        sys.exit(1)


class _Commands(click.Group):
    """The built-in commands plus those registered under :data:`COMMAND_GROUP`, each imported
    only when asked for (a built-in command never scans the entry points)."""

    def _registered(self) -> dict[str, importlib.metadata.EntryPoint]:
        return {
            ep.name: ep
            for ep in importlib.metadata.entry_points(group=COMMAND_GROUP)
            if ep.name not in self.commands
        }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self._registered()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        entry_point = self._registered().get(cmd_name)
        if entry_point is None:
            if cmd_name in HARNESS_COMMANDS:
                click.echo(
                    f"mq-sidecar: '{cmd_name}' comes with the test harness (mq-sidecar-harness, "
                    "harness/ in the repository), which is not installed: run scripts/setup.sh",
                    err=True,
                )
                ctx.exit(1)
            return None
        loaded = entry_point.load()
        if not isinstance(loaded, click.Command):
            raise click.ClickException(
                f"{COMMAND_GROUP} entry point {cmd_name} = {entry_point.value} is not a command"
            )
        return loaded


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
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
    """Run the sidecar: accept STOMP apps and relay them to the brokers (SIGHUP: reload)."""
    flags = _flags(listen, admin_listen, brokers, log_level, log_format)
    run_sidecar(
        load_or_exit(config_path, flags),
        reload_config=lambda: load_config(path=config_path, overrides=flags),
    )


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
    """Validate the configuration without running; print it (credentials redacted). Files it
    names (TLS, admin token) are not opened: they may exist only where the sidecar runs
    (a Secret mounted into its container); ``run`` checks them at start."""
    config = load_or_exit(config_path, _flags(listen, admin_listen, brokers, log_level, log_format))
    click.echo(json.dumps(config.redacted(), indent=2, sort_keys=True))
    more = f" and those of {config.brokers_file}" if config.brokers_file else ""
    click.echo(f"mq-sidecar: configuration OK ({len(config.brokers)} broker(s){more})", err=True)


if __name__ == "__main__":
    main()
