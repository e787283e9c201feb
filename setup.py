"""Build hook: with ``MQ_SIDECAR_COMPILE=1`` the pure core is compiled with mypyc.

The metadata is pyproject.toml's; this file only adds the compiled modules. Without the
variable (a plain ``pip install .``) nothing is compiled and the sources run as they are. With
it, each module of :data:`COMPILED` is compiled from its unchanged, mypy-strict source into an
extension module beside it (one shared library, ``protocol/_core__mypyc``, holds their code),
and ``protocol/_native.sha256`` records the hash of every source compiled, so that
``protocol/_native.py`` can tell a current build from a stale one. Needs mypy (it ships mypyc),
setuptools, a C compiler and the Python headers.

* in place, as scripts/setup.sh does::

      MQ_SIDECAR_COMPILE=1 .venv/bin/python setup.py build_ext --inplace

* a wheel, as the Dockerfile does::

      MQ_SIDECAR_COMPILE=1 pip wheel --no-deps --no-build-isolation .

docs/architecture.md, "The compiled core".
"""

from __future__ import annotations

import hashlib
import os
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

#: The modules compiled: protocol/ and the session's pure bookkeeping on the data path. Not
#: compiled: protocol/_native.py (it decides whether these load); protocol/_limits.py (the
#: compiled argument checks would replace Limits' own TypeError, which names the field, and
#: it is only read); proxy/reconnect/tally.py (mypyc cannot build its generic slots dataclass)
#: and proxy/session/phase.py (its error subclasses RuntimeError, which mypyc cannot), both
#: off the data path; packages' __init__.py files.
COMPILED = (
    "protocol/_connection.py",
    "protocol/_errors.py",
    "protocol/_events.py",
    "protocol/_frame.py",
    "protocol/_headers.py",
    "protocol/_heartbeat.py",
    "protocol/_parser.py",
    "protocol/_raw.py",
    "protocol/_rules.py",
    "protocol/_serializer.py",
    "protocol/_state.py",
    "protocol/_versions.py",
    "proxy/reconnect/policy.py",
    "proxy/tracking/replay.py",
    "proxy/tracking/deliveries.py",
    "proxy/tracking/links.py",
    "proxy/tracking/records.py",
    "proxy/tracking/state.py",
    "proxy/tracking/streams.py",
    "proxy/tracking/health.py",
    "proxy/telemetry/vocabulary.py",
    "proxy/tracking/window.py",
    "proxy/tracking/budget.py",
)
#: Written beside protocol/_native.py by every compiling build.
MANIFEST = "protocol/_native.sha256"
#: The one shared library of the compiled code (``<name>__mypyc``), inside the package.
GROUP = "protocol._core"

ROOT = Path(__file__).resolve().parent
COMPILE = os.environ.get("MQ_SIDECAR_COMPILE", "") not in ("", "0")


class BuildExt(build_ext):
    """build_ext that writes the manifest where the extension modules went; in place, it
    first removes the extension modules of an earlier build (one of a module no longer
    compiled would load and look for its code in the new shared library)."""

    def run(self) -> None:
        if COMPILE and self.inplace:
            for package in ("protocol", "proxy"):
                for suffix in EXTENSION_SUFFIXES:
                    for old in (ROOT / package).rglob(f"*{suffix}"):
                        old.unlink()
        super().run()
        if not COMPILE:
            return
        target = ROOT if self.inplace else Path(self.build_lib)
        lines = [
            f"{hashlib.sha256((ROOT / path).read_bytes()).hexdigest()}  {path}\n"
            for path in COMPILED
        ]
        (target / MANIFEST).write_text("".join(lines))


def _extensions() -> list[object]:
    if not COMPILE:
        return []
    from mypyc.build import mypycify  # noqa: PLC0415 (only a compiling build needs mypy)

    os.chdir(ROOT)  # mypyc takes paths relative to the project, and writes C into build/
    return list(mypycify(list(COMPILED), group_name=GROUP, opt_level="3"))


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
