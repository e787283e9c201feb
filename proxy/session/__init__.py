"""One app session kept alive across broker failure: :class:`Session` (in
:mod:`proxy.session.session`, which says where each rule of the session lives)."""

from __future__ import annotations

from proxy.session.ending import Ending, error_frame
from proxy.session.phase import Phase
from proxy.session.session import Session

__all__ = ["Ending", "Phase", "Session", "error_frame"]
