"""Sans-I/O STOMP 1.0/1.1/1.2, in the spirit of h11: bytes in, events out.

No sockets, no clock, no async: :class:`Connection` (or the bare :class:`FrameParser` and
:func:`serialize`) turns received bytes into :class:`Frame` / ``HEARTBEAT`` / ``NEED_DATA`` /
``CONNECTION_CLOSED`` events and frames into bytes to write. Time is passed in as float seconds
(:class:`HeartBeatTimer`). The I/O lives in ``proxy/``.
"""

from __future__ import annotations

# First: whether the compiled modules imported below may load (docs/architecture.md, "The
# compiled core").
from . import _native as _native  # isort: split

from ._connection import Connection as Connection
from ._errors import LocalProtocolError as LocalProtocolError
from ._errors import ProtocolError as ProtocolError
from ._errors import RemoteProtocolError as RemoteProtocolError
from ._errors import UnknownCommand as UnknownCommand
from ._events import CONNECTION_CLOSED as CONNECTION_CLOSED
from ._events import HEARTBEAT as HEARTBEAT
from ._events import NEED_DATA as NEED_DATA
from ._events import ConnectionClosed as ConnectionClosed
from ._events import Event as Event
from ._events import HeartBeat as HeartBeat
from ._events import NeedData as NeedData
from ._frame import CLIENT_COMMANDS as CLIENT_COMMANDS
from ._frame import SERVER_COMMANDS as SERVER_COMMANDS
from ._frame import Command as Command
from ._frame import Frame as Frame
from ._headers import escape_header as escape_header
from ._headers import unescape_header as unescape_header
from ._heartbeat import HeartBeatTimer as HeartBeatTimer
from ._heartbeat import negotiate_heartbeat as negotiate_heartbeat
from ._heartbeat import parse_heartbeat as parse_heartbeat
from ._limits import Limits as Limits
from ._parser import FrameParser as FrameParser
from ._raw import RawFrame as RawFrame
from ._serializer import HEARTBEAT_BYTES as HEARTBEAT_BYTES
from ._serializer import serialize as serialize
from ._state import Role as Role
from ._state import State as State
from ._versions import VERSIONS as VERSIONS
from ._versions import negotiate_version as negotiate_version

__all__ = (
    "CLIENT_COMMANDS",
    "CONNECTION_CLOSED",
    "HEARTBEAT",
    "HEARTBEAT_BYTES",
    "NEED_DATA",
    "SERVER_COMMANDS",
    "VERSIONS",
    "Command",
    "Connection",
    "ConnectionClosed",
    "Event",
    "Frame",
    "FrameParser",
    "HeartBeat",
    "HeartBeatTimer",
    "Limits",
    "LocalProtocolError",
    "NeedData",
    "ProtocolError",
    "RawFrame",
    "RemoteProtocolError",
    "Role",
    "State",
    "UnknownCommand",
    "escape_header",
    "negotiate_heartbeat",
    "negotiate_version",
    "parse_heartbeat",
    "serialize",
    "unescape_header",
)
