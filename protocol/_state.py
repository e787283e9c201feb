"""Roles, connection states and the table of state transitions.

Rule: every state change a frame causes is written in :data:`TRANSITIONS`; the connection looks
it up and never assigns a state on its own, except for the three events that are not frames:
EOF (-> CLOSED unless ERROR), a protocol error and ``send_failed()`` (-> ERROR).

::

    CLIENT  CONNECTING --recv CONNECTED--> CONNECTED --send DISCONNECT--> DISCONNECTING
    SERVER  CONNECTING --send CONNECTED--> CONNECTED --recv DISCONNECT--> DISCONNECTING
    CLIENT  CONNECTING --recv ERROR--> ERROR
    SERVER  any --send ERROR--> ERROR (unless sent with fatal=False)      EOF --> CLOSED

ERROR is terminal: the peer is expected to close (STOMP 1.2 "ERROR": the server "MUST then
close the connection just after sending the ERROR frame"). A CLIENT that receives an ERROR
after CONNECTED stays CONNECTED until the EOF, because brokers do not always close (ActiveMQ
keeps the connection after a non-fatal ERROR).
"""

from __future__ import annotations

import enum

from ._frame import Command

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["Role", "State"]


class Role(enum.Enum):
    """Which side of a STOMP connection we play."""

    #: We send CONNECT and client frames (the proxy's upstream leg to a broker).
    CLIENT = "CLIENT"
    #: We answer CONNECT with CONNECTED and send server frames (the proxy's leg to an app).
    SERVER = "SERVER"

    # Members are singletons compared by identity: hash them by identity too, in C, instead
    # of Enum.__hash__ (a Python call on every table lookup, i.e. on every frame).
    __hash__ = object.__hash__


class State(enum.Enum):
    """State of a :class:`Connection` (STOMP 1.2 "Connecting", "DISCONNECT", "ERROR")."""

    #: The CONNECT/CONNECTED exchange is not done yet.
    CONNECTING = "CONNECTING"
    #: CONNECTED was sent (server role) or received (client role); frames flow.
    CONNECTED = "CONNECTED"
    #: A DISCONNECT was sent (client role) or received (server role).
    DISCONNECTING = "DISCONNECTING"
    #: The peer closed its side (EOF).
    CLOSED = "CLOSED"
    #: A protocol error, a failed write, or an ERROR frame; the connection is unusable.
    ERROR = "ERROR"

    __hash__ = object.__hash__  # see Role


class Direction(enum.Enum):
    SENT = "sent"
    RECEIVED = "received"

    __hash__ = object.__hash__  # see Role


_S = Direction.SENT
_R = Direction.RECEIVED

#: ``TRANSITIONS[role][state][(direction, command)] -> new state``; absent means "unchanged".
TRANSITIONS: dict[Role, dict[State, dict[tuple[Direction, Command], State]]] = {
    Role.CLIENT: {
        State.CONNECTING: {
            (_R, Command.CONNECTED): State.CONNECTED,
            (_R, Command.ERROR): State.ERROR,
        },
        # A received ERROR after CONNECTED leaves the state alone: STOMP 1.2 says the server
        # closes after it, and EOF then ends the connection, but brokers do not always close
        # (ActiveMQ keeps the connection after a non-fatal ERROR such as an unexpected ACK),
        # and a client must be able to go on sending then.
        State.CONNECTED: {
            (_S, Command.DISCONNECT): State.DISCONNECTING,
        },
    },
    Role.SERVER: {
        State.CONNECTING: {
            (_S, Command.CONNECTED): State.CONNECTED,
            (_S, Command.ERROR): State.ERROR,
        },
        State.CONNECTED: {
            (_R, Command.DISCONNECT): State.DISCONNECTING,
            (_S, Command.ERROR): State.ERROR,
        },
        State.DISCONNECTING: {(_S, Command.ERROR): State.ERROR},
    },
}


def next_state(role: Role, state: State, direction: Direction, command: Command) -> State:
    """The state after ``role`` in ``state`` sent or received a ``command`` frame."""
    return TRANSITIONS[role].get(state, {}).get((direction, command), state)
