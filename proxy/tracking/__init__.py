"""Session bookkeeping, pure: subscriptions, deliveries and ack ids, transactions, identities.

No I/O and no trio here (like ``protocol/``): the session feeds frames in and gets decisions out,
and the tests drive it directly. Everything a reconnect needs to restore a session lives in
:class:`SessionState` (docs/behaviour.md, "Restoring the session"): every live subscription with the
headers it was made with, every open transaction with its frames, every message delivered to the app
and not yet acknowledged, and the identities of messages already seen, to recognise redeliveries.

Identifiers the app sees are the sidecar's own (docs/behaviour.md, "Confirmation window" and
"Duplicate detection"):

- **ack ids** (STOMP 1.2 ``ack`` header of MESSAGE) are numbers the sidecar allocates per
  session and maps to the current upstream delivery; after a failover, a redelivery of the
  same message is mapped to the same ack id (``transparent`` mode). STOMP 1.0/1.1 apps
  acknowledge by ``message-id`` (+ ``subscription`` in 1.1); those keys are mapped the same way.
- **subscription ids** upstream are the app's own (RabbitMQ names durable subscription queues
  after them, so they must survive a reconnect unchanged); a STOMP 1.0 SUBSCRIBE without an id
  gets ``<session id>-s<n>``.

The **identity** of a message is its ``mq-sidecar-id`` header (the duplicate-detection id every
SEND through a sidecar carries), else its ``message-id`` when the broker keeps message ids
stable across redelivery and failover (ActiveMQ does, RabbitMQ does not: docs/brokers.md,
"Message ids").
Each link (upstream connection) has a *generation*; a message seen again on a later generation
is a redelivery, one seen again on the same generation is a duplicate (a producer's replay).

Modules: ``state`` (:class:`SessionState`), ``deliveries`` (its delivery half), ``records``
(subscriptions, deliveries, transactions...), ``links`` (temporary destinations per leg, topic
gaps), ``window`` (the confirmation window), ``budget`` (what all sessions hold together
against ``max_memory_bytes``), ``replay`` (what restores a session on a new leg),
``streams`` (where a RabbitMQ stream subscription resumes on a new leg) and ``health`` (every
subscription's state: live, restoring, cancelled by the broker, waiting for its queue).
"""

from __future__ import annotations

from proxy.tracking.records import (
    ACK_MODES,
    ARTEMIS_DUPLICATE_ID,
    DUPLICATE_ID_HEADER,
    PASS_THROUGH,
    SIDECAR_RECEIPT,
    STREAM_CREDIT,
    TRANSACTION_OVERHEAD,
    AckMode,
    Delivered,
    Delivery,
    DurableRemoval,
    ForBroker,
    FrameRejected,
    PassThrough,
    SessionError,
    Settled,
    StoredInOutbox,
    StreamCredit,
    Subscription,
    Transaction,
    TransactionBytes,
)
from proxy.tracking.state import SessionState

__all__ = [
    "ACK_MODES",
    "ARTEMIS_DUPLICATE_ID",
    "DUPLICATE_ID_HEADER",
    "PASS_THROUGH",
    "SIDECAR_RECEIPT",
    "STREAM_CREDIT",
    "TRANSACTION_OVERHEAD",
    "AckMode",
    "Delivered",
    "Delivery",
    "DurableRemoval",
    "ForBroker",
    "FrameRejected",
    "PassThrough",
    "SessionError",
    "SessionState",
    "Settled",
    "StoredInOutbox",
    "StreamCredit",
    "Subscription",
    "Transaction",
    "TransactionBytes",
]
