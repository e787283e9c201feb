"""The words the sidecar uses for what happened: one closed vocabulary shared by the session,
the metrics (as label values), the admin plane and the events.

Every enum here is a ``StrEnum`` whose values are the exact label values exported to
Prometheus, so a value is spelled once. The module is a leaf: it imports nothing of the
sidecar, so the session, metrics, health and admin modules can all import it without cycles.
One vocabulary lives below it, where the pure bookkeeping that sets it is: a subscription's
state (``mq_sidecar_subscriptions{state}``), :class:`proxy.tracking.health.SubscriptionState`.
"""

from __future__ import annotations

import enum

__all__ = [
    "ActionResult",
    "AdminAction",
    "ClientErrorReason",
    "ConnectOutcome",
    "DrainResult",
    "FailoverReason",
    "FrameOutcome",
    "OutageOutcome",
    "OutcomeCause",
    "ProbeOutcome",
    "RelayDirection",
    "TransactionOutcome",
]


class RelayDirection(enum.StrEnum):
    """Which way a relayed frame went (label ``direction``)."""

    APP_TO_BROKER = "app_to_broker"
    BROKER_TO_APP = "broker_to_app"


class ConnectOutcome(enum.StrEnum):
    """Result of one attempt to open an upstream leg (label ``outcome``); the values are those
    of ``proxy.reconnect.walk.Attempt.outcome``, so ``ConnectOutcome(attempt.outcome)`` works."""

    #: CONNECTED received: the leg is up.
    CONNECTED = "connected"
    #: The broker answered CONNECT with an ERROR (credentials refused...): ``UpstreamRefused``.
    REFUSED = "refused"
    #: No CONNECTED within ``connect_timeout`` (a hung broker accepts TCP and says nothing).
    TIMEOUT = "timeout"
    #: TLS failed: certificate refused, handshake alert, unusable file, TLS on one side only
    #: (``proxy.legs.broker.TlsConnectFailed``).
    TLS_ERROR = "tls_error"
    #: No STOMP session: TCP refused or reset, name not resolved, garbage.
    UNREACHABLE = "unreachable"


class ProbeOutcome(enum.StrEnum):
    """Result of one readiness probe of a broker (label ``outcome``)."""

    #: CONNECTED received.
    CONNECTED = "connected"
    #: The broker answered with an ERROR (it is up; the probe's credentials were refused).
    REFUSED = "refused"
    #: No answer: connection refused, reset, timeout, garbage.
    FAILED = "failed"
    #: No probe needed: a session leg to this broker is live (its heart-beats are the proof).
    LIVE_SESSION = "live_session"


class FailoverReason(enum.StrEnum):
    """Why a session left its upstream leg (label ``reason`` of failovers and reattaches)."""

    #: TCP EOF, reset, or a write that failed (docs/behaviour.md, "Failure detection").
    CONNECTION_LOST = "connection_lost"
    #: The broker was silent past the heart-beat tolerance (docs/behaviour.md, "Failure detection").
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    #: The broker sent bytes that are not STOMP.
    PROTOCOL_ERROR = "protocol_error"
    #: The broker sent an ERROR frame that was not an answer to an app frame, then closed.
    BROKER_ERROR = "broker_error"
    #: ``priority_backup``: back to the first broker at a quiet point (not a failure).
    FAILBACK = "failback"
    #: The broker answered a frame with an ERROR that says the queue is unavailable for now
    #: (:data:`proxy.legs.dialect.RETRYABLE_ERRORS`, e.g. RabbitMQ's ``not_found`` for a
    #: classic queue whose home node is down) and closes: retried as a reconnect.
    QUEUE_UNAVAILABLE = "queue_unavailable"
    #: The broker was evacuated (an operator's ``POST /actions/evacuate``; later a broker that
    #: left the broker list): the session moved to another broker at a quiet point, as a
    #: failback does (not a failure; :mod:`proxy.reconnect.evacuations`).
    EVACUATED = "evacuated"


class OutageOutcome(enum.StrEnum):
    """How an outage ended (label ``outcome`` of ``mq_sidecar_outage_seconds``)."""

    #: Same broker again.
    REATTACHED = "reattached"
    #: Another broker (or the first one again with ``priority_backup``).
    FAILED_OVER = "failed_over"
    #: Reconnecting was given up; the app got DISCONNECT and its connection closed.
    DISCONNECTED = "disconnected"


class TransactionOutcome(enum.StrEnum):
    """What became of an app transaction (label ``outcome``; docs/behaviour.md, "Transactions")."""

    #: COMMIT confirmed by the broker.
    COMMITTED = "committed"
    #: ``transaction_failover = "replay"``: re-run on the new broker after a failover.
    REPLAYED = "replayed"
    #: ``transaction_failover = "rollback"``: dirty at failover, rolled back, COMMIT refused.
    ROLLED_BACK = "rolled_back"
    #: COMMIT sent but the leg died before its receipt: the outcome is unknown.
    IN_DOUBT = "in_doubt"


class ClientErrorReason(enum.StrEnum):
    """Why an app's frame or session was refused for the app's own fault (label ``reason``;
    docs/behaviour.md, "Limits and bad input")."""

    #: Not STOMP, or over a limit (frame size, header count or length), unknown command, a
    #: frame before CONNECT: a ``protocol.RemoteProtocolError`` from the app's leg.
    MALFORMED_FRAME = "malformed_frame"
    #: No CONNECT within ``handshake_timeout``.
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    #: ``accept-version`` names no version the sidecar speaks.
    UNSUPPORTED_VERSION = "unsupported_version"
    #: Wrong ``client_login`` / ``client_passcode``.
    AUTH_FAILED = "auth_failed"
    #: A well-formed frame the session cannot accept (unknown ack id or transaction, duplicate
    #: subscription id, too many subscriptions, NACK to a 1.0 broker...): a
    #: ``proxy.tracking.SessionError`` (session ends) or a ``FrameRejected`` (frame refused).
    INVALID_REQUEST = "invalid_request"
    #: The app was silent past its heart-beat tolerance.
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"


class FrameOutcome(enum.StrEnum):
    """What became of an app frame that did not end plainly confirmed (label ``outcome`` of
    ``mq_sidecar_frame_outcomes_total``; the ``outcome`` of each frame an OUTCOME event names,
    the ``mq-sidecar-outcome`` header of the sidecar's ERROR about one frame; docs/behaviour.md,
    "Frame outcomes").

    After JEUS' Send/AcknowledgeException, which name the failed message, and the Qpid draft's
    TransactionAborted (certainly not done) vs TransactionUnknown (may be done): each value
    says whether the frame may have taken effect on a broker.
    """

    #: Sent to a broker that was lost before confirming it, and sent again on the new leg (a
    #: consumer behind a sidecar sees one copy: ``mq-sidecar-id``); an ACK of the old leg is
    #: applied again to the redelivery (``transparent`` mode). Its RECEIPT follows as usual.
    REPLAYED = "replayed"
    #: Part of a transaction rolled back at a failover (``transaction_failover = rollback``),
    #: or by the broker when the session ended with it open: it did not take effect.
    ROLLED_BACK = "rolled_back"
    #: Reached a broker that was lost, or left, before confirming it: it may have taken effect
    #: (stored there or not, nobody knows). An in-doubt COMMIT.
    UNKNOWN = "unknown"
    #: Never reached a broker and never will (dropped unsent), or an ACK the broker will not
    #: apply (its message comes again): it did not take effect. Send it again if it matters.
    LOST = "lost"
    #: Not confirmed within ``call_timeout`` on a live leg: the app got an ERROR, and the
    #: frame may still take effect.
    TIMED_OUT = "timed_out"
    #: Refused: the broker answered it with an ERROR (passed on to the app), or the sidecar
    #: did (a stale ack id, a limit): it did not take effect.
    REFUSED = "refused"
    #: Dropped from the outbox unforwarded: it waited longer than ``outbox_max_age``. It did
    #: not take effect (no forwarder had read it; the app had its RECEIPT when it was stored).
    EXPIRED = "expired"


class OutcomeCause(enum.StrEnum):
    """Why a frame has a :class:`FrameOutcome` (the ``cause`` of each frame an OUTCOME event
    names; not a metric label)."""

    #: ``call_timeout`` passed without its RECEIPT.
    CALL_TIMEOUT = "call_timeout"
    #: The session was restored on a new leg (reattach, failover, failback).
    FAILOVER = "failover"
    #: The reconnect policy gave up (``reconnect_attempts`` / ``reconnect_period``).
    RECONNECT_EXHAUSTED = "reconnect_exhausted"
    #: Still unconfirmed when ``drain_timeout`` ran out (SIGTERM).
    DRAIN_DEADLINE = "drain_deadline"
    #: The drain on SIGTERM: a transaction open when the session ended (``rolled_back``: the
    #: broker rolls it back at DISCONNECT), or a frame the app wrote after the drain stopped
    #: taking its frames (``refused``: never forwarded).
    DRAIN = "drain"
    #: Still unconfirmed when the app's DISCONNECT ended the session.
    APP_DISCONNECT = "app_disconnect"
    #: The broker answered the frame with an ERROR.
    BROKER_ERROR = "broker_error"
    #: The sidecar answered the frame with an ERROR of its own (docs/behaviour.md, "ERROR
    #: frames": a stale ack id, a rolled-back transaction's COMMIT, a limit).
    SIDECAR_ERROR = "sidecar_error"
    #: Still unconfirmed when the broker closed the connection just after an ERROR and the
    #: session ended with it.
    BROKER_CLOSED = "broker_closed"
    #: It waited in the outbox longer than ``outbox_max_age``.
    OUTBOX_MAX_AGE = "outbox_max_age"
    #: Still unconfirmed when the session ended for another reason (the app's connection
    #: lost, a protocol error of the app's, an internal error).
    SESSION_ENDED = "session_ended"


class DrainResult(enum.StrEnum):
    """How a session's drain on SIGTERM ended (label ``result`` of ``mq_sidecar_drains_total``;
    docs/operations.md, "Running and stopping")."""

    #: Everything the session had forwarded was confirmed (and handed to the app) before
    #: ``drain_timeout``.
    COMPLETED = "completed"
    #: Something was still unconfirmed at ``drain_timeout``: named to the app as ``unknown``
    #: or ``lost``.
    DEADLINE = "deadline"


class AdminAction(enum.StrEnum):
    """An operator's action on the admin plane (label ``action`` of
    ``mq_sidecar_admin_actions_total``; docs/operations.md, "Actions")."""

    #: Move every session off a broker and keep it out of the rotation.
    EVACUATE = "evacuate"
    #: Put an evacuated broker back into the rotation.
    READMIT = "readmit"
    #: The same as :attr:`READMIT` under its first name (``/actions/restore``, deprecated:
    #: "restore" is a session's re-creation on a new leg).
    RESTORE = "restore"
    #: Begin the drain SIGTERM begins (the sidecar stops once it is done).
    DRAIN = "drain"


class ActionResult(enum.StrEnum):
    """How an admin action ended (label ``result`` of ``mq_sidecar_admin_actions_total``)."""

    #: Done (200).
    DONE = "done"
    #: Refused for what the sidecar knows (409): no other broker can take the sessions, a
    #: drain already under way, a broker not evacuated.
    REFUSED = "refused"
    #: A body that is not what the action takes, or a broker not in the list (400).
    BAD_REQUEST = "bad_request"
    #: No or a wrong bearer token (401).
    UNAUTHORIZED = "unauthorized"
    #: No ``admin_token_file``: actions are refused whatever the address (403).
    FORBIDDEN = "forbidden"
    #: The token file cannot be read (503).
    UNAVAILABLE = "unavailable"
