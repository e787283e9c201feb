"""Exec ``python ARGS...`` after asking Linux to signal it when its parent dies.

Run by ``testbed.sidecar`` as ``python -I _parent_death.py PARENT_PID SIGNAL ARGS...``: sets
``PR_SET_PDEATHSIG`` to ``SIGNAL``, exits at once if ``PARENT_PID`` is already gone (the
signal would never come), then replaces itself with ``python ARGS...`` (same PID, the
environment as given). Standard library only; it must not import ``testbed``.
"""

from __future__ import annotations

import ctypes
import os
import sys

_PR_SET_PDEATHSIG = 1


def main() -> None:
    """Set the parent-death signal, check the parent, exec the interpreter with the rest."""
    parent, signum, *args = sys.argv[1:]
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum))
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        os._exit(1)
    os.execv(sys.executable, [sys.executable, *args])


if __name__ == "__main__":
    main()
