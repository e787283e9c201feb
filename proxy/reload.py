"""SIGHUP: reload the configuration and apply what can change without dropping a session
(docs/operations.md, "Reload on SIGHUP").

The configuration is loaded again from where it came from (the file, the environment, the
flags: :func:`config.load_config`), compared option by option with the one in force, and what
changed is split in two:

- applied at once (:data:`LIVE`): the broker list (``brokers``, ``brokers_file``, its DNS
  options: a broker that leaves is evacuated, :mod:`proxy.reconnect.discovery`), the reconnect
  policy (every live session's, from its next reconnect or move; new sessions'), ``log_level``,
  ``max_sessions`` (admission only: sessions over a lowered limit stay), ``admin_token_file``
  (the next request reads the new file);
- everything else needs a restart (listeners, TLS, limits a session holds from its start, the
  outbox...): named in the log line, left as it is.

Whatever changed, the brokers file is re-read and the DNS names looked up again; a file that
does not parse or a lookup that fails keeps the list in force and is named in the line ("not
applied"). A configuration that does not load is refused whole, with its problems; the one in
force stays. One log line says what was applied and what needs a restart.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from config import Config, ConfigError
from proxy.admin.http import BearerToken
from proxy.admin.server import AdminServer
from proxy.session import Session
from proxy.session.core import session_policy
from proxy.telemetry.statistics import RotationView

__all__ = [
    "LIVE",
    "POLICY",
    "Reload",
    "Reloadable",
    "plan_reload",
    "reload_on_signal",
    "reload_sidecar",
]

log = logging.getLogger("mq_sidecar.app")

#: The reconnect policy's options (:class:`proxy.reconnect.policy.ReconnectPolicy`).
POLICY = frozenset(
    {
        "retry_interval",
        "retry_interval_multiplier",
        "max_retry_interval",
        "reconnect_attempts",
        "initial_connect_attempts",
        "reconnect_period",
        "initial_connect_period",
        "jitter",
        "randomize",
        "priority_backup",
    }
)
#: The broker list's options.
BROKER_LIST = frozenset({"brokers", "brokers_file", "dns_refresh_interval", "dns_servers"})
#: Options a SIGHUP applies; every other one needs a restart.
LIVE = BROKER_LIST | POLICY | {"log_level", "max_sessions", "admin_token_file"}


class Reloadable(Protocol):
    """What a reload changes of the running daemon (:class:`proxy.app.Sidecar`)."""

    config: Config
    sessions: set[Session]
    admin: AdminServer | None

    @property
    def rotation(self) -> RotationView: ...


@dataclass(frozen=True, slots=True)
class Reload:
    """What a reload changes: ``applied`` (in :data:`LIVE`) and ``restart`` (the others),
    option names in configuration order; ``config``: the configuration in force after it (the
    old one with the applied options' new values)."""

    applied: tuple[str, ...]
    restart: tuple[str, ...]
    config: Config


def plan_reload(old: Config, new: Config) -> Reload:
    """Compare ``old`` (in force) and ``new`` (just loaded) option by option (pure)."""
    changed = [
        f.name for f in dataclasses.fields(Config) if getattr(old, f.name) != getattr(new, f.name)
    ]
    applied = tuple(n for n in changed if n in LIVE)
    restart = tuple(n for n in changed if n not in LIVE)
    merged = dataclasses.replace(old, **{n: getattr(new, n) for n in applied})
    return Reload(applied, restart, merged)


async def reload_sidecar(sidecar: Reloadable, load: Callable[[], Config]) -> str:
    """Reload ``sidecar``'s configuration by ``load`` and apply it; returns the log line
    (also logged: a warning when something needs a restart or the reload was refused)."""
    try:
        new = load()
    except ConfigError as exc:
        line = (
            f"reload (SIGHUP) refused: {'; '.join(exc.problems)}; the configuration in force stays"
        )
        log.warning("%s", line)
        sidecar.rotation.discovery.reload_refused("; ".join(exc.problems))
        return line
    plan = plan_reload(sidecar.config, new)
    sidecar.config = plan.config
    applied = set(plan.applied)
    if "log_level" in applied:
        logging.getLogger("mq_sidecar").setLevel(plan.config.log_level.upper())
    if applied & POLICY:
        policy = session_policy(plan.config)
        for session in sidecar.sessions:
            session.core.policy = policy
    if "admin_token_file" in applied and sidecar.admin is not None:
        path = plan.config.admin_token_file
        token = BearerToken(path) if path is not None else None
        sidecar.admin.token = sidecar.admin.actions.token = token
    await sidecar.rotation.discovery.reload(plan.config)
    brokers = ", ".join(sidecar.rotation.discovery.table.labels())
    failed = sidecar.rotation.discovery.statistics().failed
    standing = "".join(f"; not applied: {f.source}: {f.reason}" for f in failed)
    line = (
        f"reload (SIGHUP): applied {', '.join(plan.applied) or 'nothing (no live option changed)'}"
        f"; needs a restart: {', '.join(plan.restart) or 'nothing'}; broker list in force: "
        f"{brokers}{standing}"
    )
    (log.warning if plan.restart or failed else log.info)("%s", line)
    return line


async def reload_on_signal(sidecar: Reloadable, load: Callable[[], Config]) -> None:
    """Reload on every SIGHUP until cancelled (run it in the sidecar's nursery, from the main
    thread: trio's signal receiver). Signals that arrive during a reload are one more."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            await reload_sidecar(sidecar, load)
