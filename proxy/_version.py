"""The installed version of mq-sidecar (``--version``, ``/status``, ``mq_sidecar_build_info``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["VERSION"]

try:
    VERSION = version("mq-sidecar")
except PackageNotFoundError:  # running from a source tree without installing
    VERSION = "0+unknown"
