"""The brokers file (option ``brokers_file``): one broker URL per line, re-read at run time
(docs/configuration.md, "A live broker list").

Format: UTF-8 text; every line that is not blank and does not start with ``#`` is one broker
URL, as in ``brokers`` (``stomp://mq-1:61613``, ``stomp+ssl://user:pass@mq-2:61614?host=/``,
``stomp://mq-headless.ns.svc:61613?dns=all``, ``stomp://_stomp._tcp.rabbitmq.ns.svc``).
Failover options (``failover:(...)?retryInterval=...``) are the configuration's, not the
file's: a line with one is refused. The daemon reads it (:func:`read_brokers_file`), never
the configuration loader: it may exist only in the sidecar's container.
"""

from __future__ import annotations

from pathlib import Path

from ._model import Broker, ConfigError
from ._url import parse_url, redact_uri

__all__ = ["parse_brokers_file", "read_brokers_file"]


def read_brokers_file(path: str) -> tuple[tuple[Broker, ...], list[str]]:
    """The brokers of the brokers file at ``path`` and the problems found: a file that cannot
    be read or does not parse gives no brokers and at least one problem (its line named)."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        return (), [f"cannot read {path}: {exc.strerror or exc}"]
    except UnicodeDecodeError as exc:
        return (), [f"{path} is not UTF-8 (byte offset {exc.start})"]
    try:
        return parse_brokers_file(text), []
    except ConfigError as exc:
        return (), exc.problems


def parse_brokers_file(text: str) -> tuple[Broker, ...]:
    """The brokers of a brokers file's ``text``, in file order.

    Raises:
        ConfigError: every problem, each naming its line (``line 3: 'stomp://a:0': broker port
            must be 1..65535, got 0``); a broker listed twice (same host and port, ignoring
            case) is one. Credentials are never quoted.
    """
    brokers: list[Broker] = []
    problems: list[str] = []
    seen: dict[tuple[str, int], int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"line {number}"
        parsed = parse_url(line)
        problems.extend(f"{where}: {p}" for p in parsed.problems)
        if parsed.options:
            names = ", ".join(s.option for s in parsed.options.values())
            problems.append(
                f"{where}: failover options ({names}) belong in the configuration, not in "
                "the brokers file"
            )
        if parsed.problems or parsed.options:
            continue
        if len(parsed.brokers) != 1:
            problems.append(f"{where}: one broker per line, got {redact_uri(line)!r}")
            continue
        broker = parsed.brokers[0]
        key = (broker.host.lower(), broker.port)
        if key in seen:
            problems.append(f"{where}: {broker.label} listed twice (first on line {seen[key]})")
            continue
        seen[key] = number
        brokers.append(broker)
    if problems:
        raise ConfigError(problems)
    return tuple(brokers)
