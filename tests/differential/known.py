"""The allow-list: the known difference classes, each with its regression test.

The product is known not to be transparent yet (issue 14). So that the stateful test
(:mod:`tests.differential.test_stateful`) can pass while these exist and still fail on any
NEW difference, every difference it finds is matched against :data:`KNOWN`; a match ends the
comparison of that example (the two runs no longer share a state), anything else fails the
test. Each class names the regression test in ``test_regressions.py`` that shows it on its
own, strictly xfailed: when the product is fixed, that test passes, turns red, and its
marker and its class here are removed together.

:data:`WAIVERS` are the known differences in a header value that would otherwise end every
example at its first CONNECT; the stateful test applies them to both runs before comparing
(the regression tests never do).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tests.differential.normalize import CLOSED, NFrame
from tests.differential.runner import Difference

__all__ = ["KNOWN", "KnownDifference", "classify", "waive"]


def _header(frame: NFrame | None, name: str) -> str | None:
    if frame is None:
        return None
    for key, value in frame.headers:
        if key == name:
            return value
    return None


def _sidecar_error(diff: Difference, pattern: str) -> bool:
    """The sidecar's first differing frame is an ERROR whose ``message`` matches."""
    _, s = diff.first()
    if s is None or s.command != "ERROR":
        return False
    return re.search(pattern, _header(s, "message") or "") is not None


def _lost_messages(diff: Difference) -> bool:
    """The sidecar run got fewer MESSAGEs on a subscription, the rest equal."""
    return (
        " subscription " in diff.stream
        and len(diff.sidecar) < len(diff.direct)
        and all(f in diff.direct for f in diff.sidecar)
    )


def _connected_headers(diff: Difference, names: set[str]) -> bool:
    d, s = diff.first()
    if d is None or s is None or d.command != "CONNECTED" or s.command != "CONNECTED":
        return False
    rest_d = [h for h in d.headers if h[0] not in names]
    rest_s = [h for h in s.headers if h[0] not in names]
    return rest_d == rest_s


def _error_vs(diff: Difference, direct_command: str) -> bool:
    """The direct run's first differing frame is ``direct_command`` (or nothing), the
    sidecar's an ERROR of its own."""
    d, s = diff.first()
    return (d is None or d.command == direct_command) and s is not None and s.command == "ERROR"


@dataclass(frozen=True)
class KnownDifference:
    """A known class of difference: ``matches(action repr, difference)``."""

    name: str
    regression: str
    summary: str
    matches: Callable[[str, Difference], bool]


#: The sidecar's own ERROR texts for input the broker judges differently (item 7 and 10).
_OWN_TEXT = (
    r"is missing the required|already in use|unsupported STOMP version|"
    r"expected CONNECT or STOMP frame|not supported in STOMP 1\.0|unknown message-id|"
    r"unknown ack id|not an open transaction|unknown subscription"
)

KNOWN: tuple[KnownDifference, ...] = (
    KnownDifference(
        "republish-hidden-as-duplicate",
        "test_republished_copy_is_delivered",
        "a re-published copy carries the first message's mq-sidecar-id: the consumer's "
        "sidecar hides it as a duplicate",
        lambda action, diff: action.startswith("Republish(") and _lost_messages(diff),
    ),
    KnownDifference(
        "republish-copies-upstream-receipt",
        "test_rabbitmq_republished_copy_receipt_is_the_apps",
        "RabbitMQ: a MESSAGE carries the sidecar's upstream receipt id; a re-published copy "
        "then gets a RECEIPT for that id instead of the app's",
        lambda action, diff: action.startswith("Republish(")
        and diff.stream.endswith(" frames")
        and diff.first()[1] is not None
        and diff.first()[1].command == "RECEIPT",  # type: ignore[union-attr]
    ),
    KnownDifference(
        "wildcard-subscribe-receipt",
        "test_activemq_wildcard_subscribe_gets_waiting_messages",
        "ActiveMQ: the sidecar's receipt on a wildcard SUBSCRIBE loses the waiting messages",
        lambda action, diff: "SUBSCRIBE" in action
        and re.search(r"\.[*>]'", action) is not None
        and _lost_messages(diff),
    ),
    KnownDifference(
        "max-frame-bytes",
        "test_sixteen_mib_send",
        "a 16 MiB SEND is refused by the sidecar's max_frame_bytes",
        lambda action, diff: _sidecar_error(diff, r"frame too large"),
    ),
    KnownDifference(
        "connect-body",
        "test_connect_with_a_newline_body",
        "CONNECT with a body of \\n: the sidecar says ERROR",
        lambda action, diff: _sidecar_error(diff, r"CONNECT frame must not have a body"),
    ),
    KnownDifference(
        "connected-1.0-headers",
        "test_stomp_1_0_connected_headers",
        "STOMP 1.0 CONNECTED: RabbitMQ sends version and heart-beat, the sidecar neither",
        lambda action, diff: _connected_headers(diff, {"version", "heart-beat"}),
    ),
    KnownDifference(
        "sidecar-judges-ack-nack",
        "test_nack_from_stomp_1_0 / test_nack_without_subscription / "
        "test_ack_with_wrong_subscription",
        "ACK/NACK the broker accepts or answers itself: the sidecar's own ERROR, closed",
        lambda action, diff: ("'ACK'" in action or "'NACK'" in action)
        and _sidecar_error(diff, _OWN_TEXT),
    ),
    KnownDifference(
        "sidecar-error-text",
        "test_send_without_destination / test_subscribe_without_destination / "
        "test_subscribe_with_an_id_in_use / test_unsupported_version / test_ack_without_id",
        "bad input the broker judges: the broker's ERROR text vs the sidecar's own",
        lambda action, diff: _sidecar_error(diff, _OWN_TEXT),
    ),
    KnownDifference(
        "closed-after-error",
        "(the same tests as sidecar-error-text)",
        "after its own ERROR the sidecar closes the connection where the broker keeps it",
        lambda action, diff: diff.first()[1] is not None
        and diff.first()[1].command == CLOSED  # type: ignore[union-attr]
        and diff.first()[0] is not None,
    ),
    KnownDifference(
        "unknown-command",
        "test_unknown_command",
        "an unknown command: the broker's ERROR (ActiveMQ: with the receipt-id) vs the "
        "sidecar's own text",
        lambda action, diff: _sidecar_error(diff, r"^unknown command"),
    ),
    KnownDifference(
        "rabbitmq-durable-without-id",
        "test_rabbitmq_stomp_1_0_durable_subscribe_without_id",
        "RabbitMQ, STOMP 1.0 durable SUBSCRIBE without id: Missing Header ERROR vs none",
        lambda action, diff: "SUBSCRIBE" in action
        and (_header(diff.first()[0], "message") or "") == "Missing Header",
    ),
    KnownDifference(
        "rabbitmq-unknown-vhost",
        "test_rabbitmq_connect_to_an_unknown_vhost",
        "RabbitMQ, CONNECT host naming no vhost: Bad CONNECT ERROR vs CONNECTED",
        lambda action, diff: "CONNECT" in action
        and (_header(diff.first()[0], "message") or "") == "Bad CONNECT",
    ),
    KnownDifference(
        "frame-before-connect",
        "test_frame_before_connect",
        "a frame before CONNECT: the broker's answer vs the sidecar's refusal",
        lambda action, diff: _sidecar_error(diff, r"expected CONNECT or STOMP frame"),
    ),
)


def classify(diff: Difference) -> KnownDifference | None:
    """The known class ``diff`` belongs to, or None: a new difference."""
    for known in KNOWN:
        if known.matches(diff.action, diff):
            return known
    return None


_SERVER = re.compile(r"^mq-sidecar \((.*)\)$")


def waive(frame: NFrame) -> NFrame:
    """The waivers of the stateful test, on CONNECTED only:

    * ``server``: the sidecar's is ``mq-sidecar (<the broker's>)`` (regression test
      ``test_connected_server_is_the_brokers``);
    * a STOMP 1.0 CONNECTED (no ``version``, or ``1.0``): ``version`` and ``heart-beat``
      are dropped, the brokers send them and the sidecar does not (regression tests
      ``test_stomp_1_0_connected_headers``).
    """
    if frame.command != "CONNECTED":
        return frame
    headers = tuple(
        (k, m.group(1) if k == "server" and (m := _SERVER.match(v)) else v)
        for k, v in frame.headers
    )
    if dict(headers).get("version", "1.0") == "1.0":
        headers = tuple((k, v) for k, v in headers if k not in ("version", "heart-beat"))
    return NFrame(frame.command, headers, frame.body)
