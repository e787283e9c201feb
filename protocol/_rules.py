"""Per-command rules of received frames: required headers and bodies, per STOMP version.

Sources: the STOMP 1.2 specification, one section per command ("SEND", "SUBSCRIBE", ...,
"MESSAGE", "RECEIPT"), and the 1.1 and 1.0 specifications for the older versions:

===========  ============================  ===========================  ==================
command      1.2                           1.1                          1.0
===========  ============================  ===========================  ==================
SEND         destination                   destination                  destination
SUBSCRIBE    destination, id               destination, id              destination
UNSUBSCRIBE  id                            id                           id or destination
ACK          id                            message-id, subscription     message-id
NACK         id                            message-id, subscription     (no NACK in 1.0)
BEGIN        transaction                   transaction                  transaction
COMMIT       transaction                   transaction                  transaction
ABORT        transaction                   transaction                  transaction
MESSAGE      destination, message-id,      destination, message-id,     destination,
             subscription                  subscription                 message-id
RECEIPT      receipt-id                    receipt-id                   receipt-id
===========  ============================  ===========================  ==================

Only SEND, MESSAGE and ERROR frames may have a body (STOMP 1.2 "Body": "Only the SEND,
MESSAGE, and ERROR frames MAY have a body. All other frames MUST NOT have a body.").
"""

from __future__ import annotations

from operator import itemgetter

from ._errors import remote_error
from ._frame import Command, Frame
from ._raw import RawFrame

__all__: list[str] = []

_BODY_ALLOWED = frozenset({Command.SEND, Command.MESSAGE, Command.ERROR})

_REQUIRED_ALL_VERSIONS: dict[Command, tuple[str, ...]] = {
    Command.SEND: ("destination",),
    Command.BEGIN: ("transaction",),
    Command.COMMIT: ("transaction",),
    Command.ABORT: ("transaction",),
    Command.RECEIPT: ("receipt-id",),
}

_REQUIRED: dict[str, dict[Command, tuple[str, ...]]] = {
    "1.0": {
        **_REQUIRED_ALL_VERSIONS,
        Command.SUBSCRIBE: ("destination",),
        Command.ACK: ("message-id",),
        Command.MESSAGE: ("destination", "message-id"),
    },
    "1.1": {
        **_REQUIRED_ALL_VERSIONS,
        Command.SUBSCRIBE: ("destination", "id"),
        Command.UNSUBSCRIBE: ("id",),
        Command.ACK: ("message-id", "subscription"),
        Command.NACK: ("message-id", "subscription"),
        Command.MESSAGE: ("destination", "message-id", "subscription"),
    },
    "1.2": {
        **_REQUIRED_ALL_VERSIONS,
        Command.SUBSCRIBE: ("destination", "id"),
        Command.UNSUBSCRIBE: ("id",),
        Command.ACK: ("id",),
        Command.NACK: ("id",),
        Command.MESSAGE: ("destination", "message-id", "subscription"),
    },
}


def required_headers(command: Command, version: str) -> tuple[str, ...]:
    """Headers a ``command`` frame must carry in STOMP ``version`` (1.0 UNSUBSCRIBE aside)."""
    return _REQUIRED[version].get(command, ())


#: The same as sets, for the one C-level subset test per frame in :func:`check_frame`.
_REQUIRED_SETS: dict[str, dict[Command, frozenset[str]]] = {
    version: {command: frozenset(names) for command, names in table.items()}
    for version, table in _REQUIRED.items()
}
_name_of = itemgetter(0)


def check_frame(frame: Frame, version: str) -> None:
    """Raise RemoteProtocolError if ``frame`` breaks its command's rules in ``version``."""
    command = frame.command
    if command is Command.NACK and version == "1.0":
        raise remote_error(
            "NACK is not supported in STOMP 1.0", "NACK was added in STOMP 1.1; use ACK."
        )
    required = _REQUIRED_SETS[version].get(command)
    if required is not None and not required.issubset(map(_name_of, frame.headers)):
        for name in required_headers(command, version):  # in the table's order
            if not frame.has(name):
                raise remote_error(
                    f"{command} frame is missing the required '{name}' header",
                    f"STOMP {version} requires the '{name}' header on {command} frames "
                    f"(STOMP specification, section {command}).",
                )
    if (
        command is Command.UNSUBSCRIBE
        and version == "1.0"
        and not (frame.has("id") or frame.has("destination"))
    ):
        raise remote_error(
            "UNSUBSCRIBE frame is missing the required 'id' or 'destination' header",
            "STOMP 1.0 UNSUBSCRIBE names the subscription by 'id' or by 'destination'.",
        )
    if frame.body and command not in _BODY_ALLOWED:
        raise remote_error(
            f"{command} frame must not have a body",
            "Only SEND, MESSAGE and ERROR frames may have a body (STOMP 1.2 'Body').",
        )


def check_raw(frame: RawFrame, version: str) -> None:
    """:func:`check_frame` for a :class:`RawFrame`: its required headers are looked up in its
    bytes; a frame that breaks a rule is parsed, and :func:`check_frame` raises the error."""
    command = frame.command
    if (
        (command is Command.NACK and version == "1.0")
        or (command is Command.UNSUBSCRIBE and version == "1.0")
        or (frame.body_length and command not in _BODY_ALLOWED)
        or not all(frame.has(name) for name in _REQUIRED[version].get(command, ()))
    ):
        check_frame(frame.to_frame(), version)
