"""mq-sidecar configuration: model, broker-URL parsing, TOML/env/CLI loading, validation.

Public API (everything else is private)::

    cfg = load_config(path="mq-sidecar.toml", overrides={"brokers": "stomp://a:61613"})

* :class:`Config`, :class:`Broker`, :class:`Secret`: frozen value objects. Durations
  are ``int`` milliseconds (the Artemis convention), sizes are bytes.
* :func:`load_config`: defaults < TOML file < ``MQ_SIDECAR_*`` environment <
  overrides (the CLI), key by key; raises :class:`ConfigError` with *all* problems.
* :func:`parse_broker_url`: ActiveMQ/Artemis failover URLs
  (``failover:(stomp://a:61613,stomp+ssl://b:61614)?retryInterval=100``).
* :func:`parse_address`: ``host:port`` / ``[::1]:61613``.
* :func:`read_brokers_file`: the brokers file (``brokers_file``), read and parsed, problems
  naming their lines; :func:`parse_dns_server`: one entry of ``dns_servers``.
* :data:`OPTIONS`: the option table (``Config`` field name -> :class:`Option`), for
  building the CLI and ``--help``; :data:`ENV_PREFIX` = ``"MQ_SIDECAR_"``.

Credentials never appear in a repr, str, :meth:`Config.redacted` view or error message
(docs/configuration.md, "Credentials").
"""

from __future__ import annotations

from ._brokers_file import read_brokers_file
from ._dns import parse_dns_server
from ._load import CONFIG_ENV, load_config
from ._model import (
    REDACTED,
    Broker,
    Config,
    ConfigError,
    Durations,
    FailoverMode,
    Secret,
    TransactionFailover,
)
from ._options import ENV_PREFIX, OPTIONS, Option
from ._url import FAILOVER_OPTIONS, FailoverOption, parse_address, parse_broker_url

__all__ = (
    "CONFIG_ENV",
    "ENV_PREFIX",
    "FAILOVER_OPTIONS",
    "OPTIONS",
    "REDACTED",
    "Broker",
    "Config",
    "ConfigError",
    "Durations",
    "FailoverMode",
    "FailoverOption",
    "Option",
    "Secret",
    "TransactionFailover",
    "load_config",
    "parse_address",
    "parse_broker_url",
    "parse_dns_server",
    "read_brokers_file",
)
