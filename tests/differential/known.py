"""The allow-list: the known difference classes, each with its regression test.

The product is known not to be transparent yet (issue 14). So that the stateful test
(:mod:`tests.differential.test_stateful`) can pass while these exist and still fail on any
NEW difference, every difference it finds is matched against :data:`KNOWN`; a match ends the
comparison of that example (the two runs no longer share a state), anything else fails the
test. Each class names the regression test in ``test_regressions.py`` that shows it on its
own, strictly xfailed: when the product is fixed, that test passes, turns red, and its
marker and its class here are removed together.


Fixed since the harness found them (their regression tests pass and carry no marker): the
re-published copy hidden as a duplicate on ActiveMQ, the sidecar's receipt id in RabbitMQ's
MESSAGEs, the CONNECTED ``server`` header, the 16 MiB SEND, CONNECT with a body
of ``\n``, the STOMP 1.0 CONNECTED headers, the sidecar's own ERROR texts for SEND/SUBSCRIBE
without destination, a SUBSCRIBE id in use, an unsupported version (ActiveMQ), a 1.2 ACK
without id, RabbitMQ's NACK/ACK of 1.0/1.1 apps, RabbitMQ's 1.0 durable SUBSCRIBE without
id, and a frame before CONNECT; and of issue 25: an unknown command (the broker's ERROR, and
ActiveMQ's close after it), the CONNECTED ``heart-beat`` (the broker's answer to the app's ask,
now compared by value), a stray NUL before a command or CONNECT, a second DISCONNECT,
RabbitMQ's durable SUBSCRIBE without id marked by the legacy ``persistent:true``, and RabbitMQ's
implicit connect (``stomp.implicit_connect``, a node of its own in the test bed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tests.differential.normalize import CLOSED, NFrame
from tests.differential.runner import Difference

__all__ = [
    "KNOWN",
    "KnownDifference",
    "classify",
]


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


def _sidecar_first(diff: Difference) -> str | None:
    """The command of the sidecar run's first differing frame (None: it has none)."""
    _, s = diff.first()
    return None if s is None else s.command


def _swapped(diff: Difference) -> Difference:
    return Difference(diff.step, diff.action, diff.stream, diff.sidecar, diff.direct)


def _cr_stripped(diff: Difference) -> bool:
    """Both MESSAGE; the direct one's header values end with a CR the sidecar's lack."""
    d, s = diff.first()
    if d is None or s is None or d.command != "MESSAGE" or s.command != "MESSAGE":
        return False
    # A CR, or its STOMP 1.2 escape as a 1.2 consumer (the final drain) gets it.
    stripped = tuple((k, v.removesuffix("\r").removesuffix("\\r")) for k, v in d.headers)
    return stripped == s.headers and d.headers != s.headers


def _lost_messages(diff: Difference) -> bool:
    """The sidecar run got fewer MESSAGEs on a subscription, the rest equal."""
    return (
        " subscription " in diff.stream
        and len(diff.sidecar) < len(diff.direct)
        and all(f in diff.direct for f in diff.sidecar)
    )


@dataclass(frozen=True)
class KnownDifference:
    """A known class of difference: ``matches(action repr, difference)``."""

    name: str
    regression: str
    summary: str
    matches: Callable[[str, Difference], bool]


KNOWN: tuple[KnownDifference, ...] = (
    KnownDifference(
        "wildcard-subscribe-receipt",
        "test_activemq_wildcard_subscribe_gets_waiting_messages",
        "ActiveMQ: the sidecar's receipt on a wildcard SUBSCRIBE loses the waiting messages "
        "(seen in the direct run too: ActiveMQ 5.17's own nondeterminism; the test has no "
        "marker)",
        lambda action, diff: (
            "SUBSCRIBE" in action
            and re.search(r"\.[*>]'", action) is not None
            and (_lost_messages(diff) or _lost_messages(_swapped(diff)))
        ),
    ),
    KnownDifference(
        "ack-nack-judged-as-stomp-1.2",
        "test_nack_from_stomp_1_0 / test_nack_without_subscription / "
        "test_ack_with_wrong_subscription",
        "ActiveMQ: a 1.0/1.1 app's ACK/NACK the broker refuses by its 1.0/1.1 rules reaches it "
        "as STOMP 1.2 (the upstream leg's version): another ERROR text",
        lambda action, diff: (
            ("'ACK'" in action or "'NACK'" in action)
            and _sidecar_error(diff, r"without an? ack (header|id)")
        ),
    ),
    KnownDifference(
        "crlf-in-stomp-1.1",
        "test_stomp_1_1_send_with_crlf_line_ends",
        "a STOMP 1.1 SEND with CRLF line ends: ActiveMQ keeps the CR in header values (1.1 has "
        "no CRLF), the sidecar strips it",
        lambda action, diff: _cr_stripped(diff),
    ),
    KnownDifference(
        "header-line-without-colon",
        "test_header_line_without_colon",
        "a header line without ':': the broker's answer (ActiveMQ closes without a frame) vs "
        "the sidecar's ERROR",
        lambda action, diff: _sidecar_error(diff, r"^header line without"),
    ),
    KnownDifference(
        "closed-after-broker-error",
        "test_unsupported_version",
        "RabbitMQ keeps a connection open after some ERRORs (Version mismatch, Bad CONNECT of an "
        "unknown vhost); the sidecar closes it",
        lambda action, diff: diff.first()[0] is None and _sidecar_first(diff) == CLOSED,
    ),
    KnownDifference(
        "host-names-the-sidecar",
        "test_rabbitmq_connect_host_naming_the_sidecar",
        "kept on purpose: a CONNECT host naming the server the app connected to (localhost, "
        "127.0.0.1) means the broker's configured vhost through the sidecar; directly, "
        "RabbitMQ looks for a vhost of that name",
        lambda action, diff: (
            re.search(r"\('host', '(localhost|127\.[0-9.]+)'\)", action) is not None
            and (_header(diff.first()[0], "message") or "") == "Bad CONNECT"
        ),
    ),
)


def classify(diff: Difference) -> KnownDifference | None:
    """The known class ``diff`` belongs to, or None: a new difference."""
    for known in KNOWN:
        if known.matches(diff.action, diff):
            return known
    return None
