"""Which build of the core this process runs: the mypyc-compiled modules or their sources.

``scripts/setup.sh`` and the image's wheel build compile the pure core with mypyc
(``setup.py``, ``MQ_SIDECAR_COMPILE=1``): every module in ``setup.py``'s ``COMPILED`` list gets
an extension module beside its ``.py`` file, and the build writes ``protocol/_native.sha256``,
the SHA-256 of each source it compiled (``sha256sum`` format, paths from the directory that
holds ``protocol/``). Python imports an extension module in preference to the ``.py`` file
beside it; this module decides, once per process and before any of them is imported (the
first thing ``protocol/__init__.py`` and ``proxy/__init__.py`` do), whether that may happen:

* **compiled** when the manifest is there, every source in it still has the hash it was
  compiled from, and its extension module exists for this interpreter;
* **pure Python** otherwise, or when ``MQ_SIDECAR_PURE`` is set to anything but ``""`` or
  ``"0"``: an import hook then loads the modules of ``protocol`` and ``proxy`` from their
  ``.py`` files even where an extension module sits beside them. So a source edited since the
  last build runs as written until the next build, never as a stale extension.

All or nothing: compiled modules call each other's native code directly, so one module loaded
from source among compiled ones would be a second copy of its classes. Reading the manifest
and hashing the sources (about 300 KB) is import machinery, done once, not protocol I/O.
docs/architecture.md, "The compiled core".
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from importlib.util import spec_from_file_location
from pathlib import Path
from types import ModuleType

__all__: list[str] = []

#: Set to anything but "" or "0": run the pure-Python sources even where a build exists.
PURE_ENV = "MQ_SIDECAR_PURE"
#: The packages whose modules may be compiled.
PACKAGES = ("protocol", "proxy")
#: The directory that holds ``protocol/`` and ``proxy/`` (the repository, or site-packages).
ROOT = Path(__file__).resolve().parent.parent
#: What the build compiled: ``<sha256>  <path from ROOT>`` per module.
MANIFEST = Path(__file__).with_name("_native.sha256")


def extension_of(source: Path) -> Path | None:
    """The extension module built from ``source`` for this interpreter, if there is one."""
    stem = str(source.with_suffix(""))
    for suffix in EXTENSION_SUFFIXES:
        candidate = Path(stem + suffix)
        if candidate.is_file():
            return candidate
    return None


def module_name(path: str) -> str:
    """``protocol/_parser.py`` -> ``protocol._parser``."""
    return path.removesuffix(".py").replace("/", ".")


def decide(
    environ: Mapping[str, str], manifest: Path = MANIFEST
) -> tuple[bool, str, tuple[str, ...]]:
    """(compiled?, why, the modules the build compiled) for ``environ`` and ``manifest``."""
    pure = environ.get(PURE_ENV, "")
    try:
        lines = manifest.read_text().splitlines()
    except OSError:
        return False, "pure Python: no compiled build (scripts/setup.sh builds one)", ()
    modules = tuple(module_name(line.partition("  ")[2]) for line in lines)
    if pure not in ("", "0"):
        return False, f"pure Python: {PURE_ENV}={pure}", modules
    root = manifest.resolve().parent.parent
    for line in lines:
        digest, _, name = line.partition("  ")
        source = root / name
        try:
            data = source.read_bytes()
        except OSError:
            return False, f"pure Python: {name}, compiled by the last build, is missing", modules
        if hashlib.sha256(data).hexdigest() != digest:
            return (
                False,
                f"pure Python: {name} changed since the last build (scripts/setup.sh rebuilds)",
                modules,
            )
        if extension_of(source) is None:
            return False, f"pure Python: {name} has no compiled module for this Python", modules
    return True, f"compiled (mypyc): {len(modules)} modules", modules


class SourceFinder(MetaPathFinder):
    """Imports the modules of :data:`PACKAGES` from their ``.py`` files even where an
    extension module sits beside one (the pure-Python build)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if path is None or fullname.partition(".")[0] not in PACKAGES:
            return None
        leaf = fullname.rpartition(".")[2]
        for directory in path:
            source = Path(directory, leaf + ".py")
            if source.is_file() and extension_of(source) is not None:
                return spec_from_file_location(fullname, source)
        return None


#: True when the compiled modules load, False when their sources do.
COMPILED: bool
#: One line saying which build runs and why (``python -c 'import protocol._native as n;
#: print(n.STATUS)'``).
STATUS: str
#: The modules the last build compiled (empty when there is no build).
MODULES: tuple[str, ...]
COMPILED, STATUS, MODULES = decide(os.environ)
if not COMPILED and not any(isinstance(f, SourceFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, SourceFinder())
