"""Logging set-up: one line per event, as text or JSON (``--log-format json``).

Credentials never reach a log line: the code logs broker labels (``host:port``) and STOMP
commands, never CONNECT headers, and config objects render secrets as ``***``.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["JsonFormatter", "configure_logging"]


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON object: ts (RFC 3339, UTC), level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, object] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str, fmt: str) -> None:
    """Send ``mq_sidecar.*`` logs to stderr at ``level`` ("debug"... "error") as ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("mq_sidecar")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
