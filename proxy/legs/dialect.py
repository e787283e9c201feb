"""What a broker does differently, as one value built when a leg connects (pure).

:class:`BrokerDialect` is read off the ``server`` header of the broker's CONNECTED frame
(STOMP 1.2 "CONNECTED": ``server:name/version``) once, by
:class:`~proxy.legs.broker.Upstream`, and the session reads it where a rule depends on the
broker (docs/brokers.md says how ActiveMQ Classic 5.17 and RabbitMQ 3.10 differ, measured).
ActiveMQ Artemis announces itself as ``ActiveMQ-Artemis/...``; a broker that names none of
these gets the defaults of a STOMP 1.2 broker that follows the specification (cumulative
receipts, Artemis' duplicate-detection header understood).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from protocol import Frame
from proxy.tracking.health import SubscriptionState

__all__ = ["RETRYABLE_ERRORS", "BrokerDialect", "HeartBeatAnswer", "RetryableError"]


class HeartBeatAnswer(Enum):
    """How a broker answers the ``heart-beat:cx,cy`` of a client's CONNECT in its CONNECTED
    (STOMP 1.2 "Heart-beating" leaves the server's values to the server), measured for every
    version the client speaks (a STOMP 1.0 client asking gets them too; one that does not ask,
    ``0,0``): tests/differential/test_regressions.py, test_connected_heart_beat_is_the_brokers.
    """

    #: Not known (a broker other than these): the sidecar answers its own
    #: ``client_heartbeat`` (none to a STOMP 1.0 app).
    UNKNOWN = "unknown"
    #: ``cy,cx``: the client's values swapped (ActiveMQ Classic 5.17, ProtocolConverter).
    SWAPPED = "swapped"
    #: ``cy,cx`` each in whole seconds: 0 stays 0, under 1000 ms is 1000, else rounded down
    #: to a second (RabbitMQ 3.10: ``100,100`` -> ``1000,1000``, ``1500,2500`` ->
    #: ``2000,1000``; rabbit_stomp_processor's millis_to_seconds).
    SWAPPED_WHOLE_SECONDS = "swapped-whole-seconds"

    def answer(self, ask: tuple[int, int]) -> tuple[int, int] | None:
        """The broker's CONNECTED ``(sx, sy)`` ms for a client asking ``ask`` = ``(cx, cy)``
        ms; None for :attr:`UNKNOWN`."""
        cx, cy = ask
        if self is HeartBeatAnswer.SWAPPED:
            return (cy, cx)
        if self is HeartBeatAnswer.SWAPPED_WHOLE_SECONDS:
            return (_whole_seconds(cy), _whole_seconds(cx))
        return None


def _whole_seconds(ms: int) -> int:
    """RabbitMQ's rounding of a heart-beat interval: 0 -> 0, 1..999 -> 1000, else down to a
    whole second, in ms."""
    if ms <= 0:
        return 0
    return max(ms // 1000, 1) * 1000


@dataclass(frozen=True, slots=True)
class RetryableError:
    """A broker ERROR that says the frame's queue is unavailable for now, not that the frame
    is wrong: the sidecar keeps it from the app and retries the session as a reconnect, its
    window kept (docs/brokers.md, "Errors retried as a reconnect").

    Attributes:
        broker: the ``server`` header's prefix of the brokers that send it.
        message: the ERROR's ``message`` header, exactly.
        body_contains: text its body contains.
        meaning: what it means, measured (for logs and docs).
        subscriptions: what it makes of the subscriptions it names (its ``subscription``
            header, else the queue its body quotes, :func:`proxy.tracking.health.
            unavailable_queue`; :meth:`proxy.tracking.SessionState.subscriptions_refused`):
            cancelled by the broker, or waiting for their queue (the default).
    """

    broker: str
    message: str
    body_contains: str
    meaning: str
    subscriptions: SubscriptionState = SubscriptionState.WAITING_FOR_QUEUE

    def matches(self, server: str, error: Frame) -> bool:
        """Whether ``error`` from a broker that says ``server:<server>`` is this one."""
        return (
            server.startswith(self.broker)
            and error.get("message") == self.message
            and self.body_contains.encode() in error.body
        )


#: The broker ERRORs retried as a reconnect, each measured on the real broker
#: (tests/integration/test_rabbitmq_cluster.py).
RETRYABLE_ERRORS: tuple[RetryableError, ...] = (
    RetryableError(
        broker="RabbitMQ",
        message="not_found",
        body_contains="is down or inaccessible",
        meaning="a classic queue whose home node is down; RabbitMQ 3.10 sends it to a SEND "
        "or a SUBSCRIBE and closes the connection",
    ),
    RetryableError(
        broker="RabbitMQ",
        message="Server cancelled subscription",
        body_contains="The server has canceled a subscription",
        meaning="the broker cancelled a live subscription (its queue's home node went down, "
        "or the queue was deleted; rabbitmq-server#2410): the connection stays open and no "
        "message comes again, so the subscription is restored by a reconnect",
        subscriptions=SubscriptionState.CANCELLED_BY_BROKER,
    ),
    RetryableError(
        broker="RabbitMQ",
        message="precondition_failed",
        body_contains="does not have a replica on the local node",
        meaning="a stream whose members are restarted while its writer moves (its node was "
        "stopped: RabbitMQ 3.10 answers a SUBSCRIBE on another node so for a moment during a "
        "rolling restart, measured) and closes the connection",
    ),
)


@dataclass(frozen=True, slots=True)
class BrokerDialect:
    """How one broker confirms, what it copies, which ids it understands, its known bugs.

    Build it with :meth:`from_server`; every field is a fact measured against the broker
    named in its comment.
    """

    #: The broker's ``server`` header ("" if none), e.g. ``ActiveMQ/5.17.6``,
    #: ``RabbitMQ/3.10.8``, ``ActiveMQ-Artemis/2.31.2``.
    server: str = ""
    #: One RECEIPT confirms every frame sent before it. RabbitMQ sends a SEND's RECEIPT when
    #: the message is confirmed (publisher confirms), a transient message at once and a
    #: persistent one after it is on disk, so its receipts overtake each other (measured in
    #: tests/integration/test_failover.py): there every SEND needs its own.
    cumulative_receipts: bool = True
    #: SENDs carry Artemis' duplicate-detection header ``_AMQ_DUPL_ID`` beside
    #: ``mq-sidecar-id`` (docs/behaviour.md, "Duplicate detection"): yes unless the broker is
    #: ActiveMQ Classic (``ActiveMQ/5...``) or RabbitMQ, which ignore it but store it as one
    #: more message property.
    artemis_duplicate_ids: bool = True
    #: A ``client``-mode ACK settles only its own subscription's messages (ActiveMQ, Artemis).
    #: RabbitMQ's is an AMQP ``basic.ack`` with ``multiple`` on the connection's channel: it
    #: also settles another subscription's unacknowledged messages (measured, RabbitMQ 3.10).
    client_ack_per_subscription: bool = True
    #: A STOMP 1.1 ACK/NACK is settled by its ``message-id`` alone, whatever its
    #: ``subscription`` header names: RabbitMQ (measured, RabbitMQ 3.10).
    acks_ignore_subscription: bool = False
    #: The broker copies a SEND's ``receipt`` header into the MESSAGEs it delivers (RabbitMQ
    #: keeps every header of the SEND; measured with the Ruby stomp gem, whose ``unreceive``
    #: re-sent it and got a RECEIPT it never asked for).
    copies_receipt_into_messages: bool = False
    #: STOMP 1.0 frames follow RabbitMQ's rules: a 1.0 client's NACK is accepted (ActiveMQ
    #: refuses it: "NACK received but connection is in v1.0 mode"), and a durable SUBSCRIBE
    #: or UNSUBSCRIBE without ``id`` is refused ("Header 'id' is required for durable
    #: subscriptions"; ActiveMQ accepts it), durable meaning ``durable:true`` or the legacy
    #: ``persistent:true`` (:meth:`refuses_durable_without_id`). Measured with RabbitMQ 3.10 /
    #: ActiveMQ 5.17.
    rabbitmq_stomp10_rules: bool = False
    #: A ``receipt`` on a SUBSCRIBE to a wildcard destination (``/queue/a.*``, ``/queue/a.>``)
    #: can make the broker dispatch none of the messages already waiting: ActiveMQ Classic
    #: 5.17 (measured: 0 of 2 waiting messages in about half the tries with a receipt, 2 of 2
    #: every time without one, and every time when the receipt rides on a later frame).
    receipt_breaks_wildcard_subscribe: bool = False
    #: The broker keeps a message's ``message-id`` across redelivery and failover: ActiveMQ
    #: Classic and Artemis do, RabbitMQ does not (docs/brokers.md, "Message ids").
    stable_message_ids: bool = False
    #: How its CONNECTED answers a client's ``heart-beat`` (:class:`HeartBeatAnswer`): what
    #: the sidecar answers the app (the upstream leg keeps the sidecar's own heart-beats,
    #: ``upstream_heartbeat``, for failure detection).
    heart_beat_answer: HeartBeatAnswer = HeartBeatAnswer.UNKNOWN
    #: A client silent past the heart-beats it promised is closed without an ERROR frame:
    #: ActiveMQ 5.17 and RabbitMQ 3.10 (measured: asked 100,100, ActiveMQ closes after 0.3 s,
    #: RabbitMQ, at 1000 ms, after 3 s; neither writes a frame first).
    closes_silent_clients_quietly: bool = False
    #: How the broker names the temporary destinations a client makes (``/temp-queue/x``;
    #: :class:`proxy.tracking.links.TempNames`): ``"activemq"`` (ActiveMQ Classic: after the
    #: connection's id, which its CONNECTED ``session`` header gives unless the app's CONNECT
    #: set ``client-id``; StompProtocolConverter, measured), ``"rabbitmq"`` (a random name the
    #: sidecar learns from the broker, measured with RabbitMQ 3.10), ``""`` (not known).
    temp_names: str = ""
    #: A browser whose browse ended stays subscribed until UNSUBSCRIBE, so a failover must not
    #: browse again (ActiveMQ Classic; :meth:`proxy.tracking.SessionState.new_link`).
    keeps_finished_browsers: bool = False
    #: OpenTelemetry's ``messaging.system`` for this broker (:func:`messaging_system`).
    messaging_system: str = "stomp"

    @classmethod
    def from_server(cls, server: str | None) -> BrokerDialect:
        """The dialect of the broker whose CONNECTED frame said ``server:<server>`` (None or
        "" when it sent none)."""
        server = server or ""
        rabbitmq = server.startswith("RabbitMQ")
        activemq = server.startswith("ActiveMQ")
        return cls(
            server=server,
            cumulative_receipts=not rabbitmq,
            artemis_duplicate_ids=not (rabbitmq or server.startswith("ActiveMQ/")),
            client_ack_per_subscription=not rabbitmq,
            acks_ignore_subscription=rabbitmq,
            copies_receipt_into_messages=rabbitmq,
            rabbitmq_stomp10_rules=rabbitmq,
            receipt_breaks_wildcard_subscribe=server.startswith("ActiveMQ/"),
            stable_message_ids=activemq,
            closes_silent_clients_quietly=rabbitmq or server.startswith("ActiveMQ/"),
            temp_names="activemq"
            if server.startswith("ActiveMQ/")
            else "rabbitmq"
            if rabbitmq
            else "",
            keeps_finished_browsers=server.startswith("ActiveMQ/"),
            messaging_system=messaging_system(server),
            heart_beat_answer=(
                HeartBeatAnswer.SWAPPED_WHOLE_SECONDS
                if rabbitmq
                else HeartBeatAnswer.SWAPPED
                if server.startswith("ActiveMQ/")
                else HeartBeatAnswer.UNKNOWN
            ),
        )

    def retryable_error(self, error: Frame) -> RetryableError | None:
        """The :data:`RETRYABLE_ERRORS` entry ``error`` is, when this broker sent it; None
        for every other ERROR (which answers the app's frame and reaches the app)."""
        return next((r for r in RETRYABLE_ERRORS if r.matches(self.server, error)), None)

    def refuses_durable_without_id(self, frame: Frame) -> bool:
        """Whether this broker refuses ``frame``, a SUBSCRIBE or UNSUBSCRIBE, as durable
        without ``id``: RabbitMQ (:attr:`rabbitmq_stomp10_rules`) when it has no ``id`` and
        ``durable:true`` or ``persistent:true`` (ERROR ``Missing Header``, in every version;
        rabbit_stomp_processor's validate_frame, measured with RabbitMQ 3.10)."""
        return (
            self.rabbitmq_stomp10_rules
            and not frame.has("id")
            and (frame.get("durable") == "true" or frame.get("persistent") == "true")
        )

    def subscribe_receipt_breaks(self, destination: str) -> bool:
        """Whether a ``receipt`` on a SUBSCRIBE to ``destination`` may make this broker
        dispatch none of the messages already waiting (:attr:`receipt_breaks_wildcard_subscribe`
        and ``destination`` names several: ActiveMQ wildcards, ``*`` for one element of a
        ``.``-separated name, ``>`` for the rest; ActiveMQ "Wildcards")."""
        if not self.receipt_breaks_wildcard_subscribe:
            return False
        name = destination.rpartition("/")[2]
        return any(part in ("*", ">") for part in name.split("."))


def messaging_system(server: str) -> str:
    """``messaging.system`` (OpenTelemetry's semantic conventions) for a broker's CONNECTED
    ``server`` header: ``rabbitmq`` (``RabbitMQ/3.10.8``), ``activemq`` (``ActiveMQ/5.17.6``,
    ``ActiveMQ-Artemis/2.31.2``: OpenTelemetry names one value for both), else the product
    lowercased, ``stomp`` if none."""
    product = server.split("/", 1)[0].strip().lower()
    if product.startswith("rabbitmq"):
        return "rabbitmq"
    if product.startswith("activemq"):
        return "activemq"
    return product or "stomp"
