"""Refused logins during a real failover (issue 16, item 3), against RabbitMQ (it checks every
login: only guest exists) and ActiveMQ with ``simpleAuthenticationPlugin`` (``auth=``).

* Every broker refuses: the app's broker is killed (-9) and comes back with the app's password
  rotated, the other broker never knew the app. The app gets its DISCONNECT event and an ERROR
  with the brokers' words one round after the last broker began refusing, not after
  ``reconnect_period`` (300 s). The times are printed (run with ``-s``).
* A refusing broker is skipped while another accepts: after one session found RabbitMQ
  refusing on its way to the second ActiveMQ, the next session goes there without trying it.

Docs: docs/behaviour.md, "Broker list and reconnect policy".
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp
from prometheus_client.parser import text_string_to_metric_families

from testbed import ActiveMQ, RabbitMQ
from testbed.probe import stomp_handshake
from tests.integration.support import (
    WAIT,
    Client,
    SidecarThread,
    sidecar_config,
    unique,
    wait_until,
)

EVENTS = "/mq-sidecar/events"
#: ActiveMQ's words for a wrong login (simpleAuthenticationPlugin).
AMQ_WORDS = "User name [app] or password is invalid."
#: RabbitMQ's: the ERROR's message says "Bad CONNECT", its body says this.
RMQ_WORDS = "Access refused for user 'app'"


class Arrivals(stomp.ConnectionListener):  # type: ignore[misc]
    """When (time.monotonic) each MESSAGE (by its ``event`` header) and ERROR arrived."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str, dict[str, str], str]] = []

    def on_message(self, frame: Any) -> None:
        self.seen.append((time.monotonic(), "MESSAGE", dict(frame.headers), frame.body))

    def on_error(self, frame: Any) -> None:
        self.seen.append((time.monotonic(), "ERROR", dict(frame.headers), frame.body))

    def first(self, command: str, event: str | None = None) -> tuple[float, dict[str, str], str]:
        for at, seen, headers, body in list(self.seen):
            if seen == command and (event is None or headers.get("event") == event):
                return at, headers, body
        raise AssertionError(f"no {command} {event or ''} in {self.seen}")


class Attempts(logging.Handler):
    """The sidecar's connection attempts (its DEBUG lines ``session S: broker B OUTCOME:``),
    with the time.monotonic() at which each was logged: the sidecar runs in this process."""

    LINE = re.compile(r"^session (\S+): broker (\S+) (refused|unreachable|timeout|tls_error):")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.attempts: list[tuple[float, str, str]] = []  # (at, broker, outcome)

    def emit(self, record: logging.LogRecord) -> None:
        match = self.LINE.match(record.getMessage())
        if match:
            self.attempts.append((time.monotonic(), match[2], match[3]))


@pytest.fixture
def attempts() -> Iterator[Attempts]:
    handler = Attempts()
    logger = logging.getLogger("mq_sidecar.session")
    saved = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


def amq_with_auth(tmp_path: Path, name: str, password: str) -> ActiveMQ:
    broker = ActiveMQ(name, tmp_path, heap_mb=128, auth={"app": password})
    broker.start()
    broker.wait_ready()
    return broker


def sidecar_before(*brokers: ActiveMQ | RabbitMQ, **policy: str) -> SidecarThread:
    """A sidecar (not started: use ``with``) in front of ``brokers`` in that order."""
    urls = ",".join(b.stomp_url for b in brokers)
    return SidecarThread(sidecar_config(f"failover:({urls})", connect_timeout="2000", **policy))


def app_on(address: tuple[str, int]) -> tuple[Client, Arrivals]:
    """An app logged in as app/app-pw through the sidecar, subscribed to its events."""
    app = Client(address)
    arrivals = Arrivals()
    app.conn.set_listener("arrivals", arrivals)
    app.connect(login="app", passcode="app-pw")
    app.conn.subscribe(destination=EVENTS, id="events", ack="auto", headers={"receipt": "ev"})
    app.receipt("ev")
    return app, arrivals


def refuses(broker: ActiveMQ, passcode: str) -> bool:
    """Whether ``broker`` answers a CONNECT as app/``passcode`` with an ERROR (False while it
    does not answer at all)."""
    try:
        result = stomp_handshake(
            broker.host, broker.stomp_port, timeout=1.0, vhost="localhost", login="app",
            passcode=passcode,
        )  # fmt: skip
    except (OSError, EOFError):
        return False
    return not result.connected and AMQ_WORDS in result.describe()


def test_every_broker_refusing_after_a_kill_tells_the_app_within_one_round(
    tmp_path: Path, rabbitmq: RabbitMQ, attempts: Attempts
) -> None:
    """ActiveMQ (the app's broker) is killed -9 and restarted with the app's password
    rotated; RabbitMQ never had the user. While ActiveMQ is down the session keeps trying
    (RabbitMQ's refusal alone is not the end: ActiveMQ may come back and accept); once
    ActiveMQ refuses too, the next round is the last: DISCONNECT, then the ERROR."""
    amq = amq_with_auth(tmp_path, "amq-auth", "app-pw")
    try:
        assert refuses(amq, "wrong")  # the test bed's auth= option at work
        with sidecar_before(
            amq, rabbitmq, retry_interval="50", max_retry_interval="500"
        ) as sidecar:
            app, arrivals = app_on(sidecar.address)
            amq.kill()
            killed = time.monotonic()
            amq.auth = {"app": "rotated-pw"}
            amq.start()
            deadline = time.monotonic() + 30
            while not refuses(amq, "app-pw"):  # from here on, every broker refuses
                assert time.monotonic() < deadline, "ActiveMQ did not come back"
                time.sleep(0.005)
            probed = time.monotonic()
            app.expect("ERROR", timeout=WAIT)
            wait_until(lambda: not sidecar.statistics().sessions)
    finally:
        amq.stop()

    disconnect_at, _, body = arrivals.first("MESSAGE", "DISCONNECT")
    error_at, error, detail = arrivals.first("ERROR")
    event = json.loads(body)
    reason = event["reason"]
    assert "every broker refused the CONNECT" in reason
    # the brokers' words, with the login they quote redacted (no credential in events)
    shown = (RMQ_WORDS.replace("'app'", "'***'"), AMQ_WORDS.replace("[app]", "[***]"))
    assert any(words in reason for words in shown), reason
    assert "[app]" not in reason
    assert "'app'" not in reason
    assert "every broker refused the CONNECT" in detail
    assert any(words in detail for words in shown), detail
    assert error["message"].startswith("mq-sidecar lost the broker connection")
    # ActiveMQ refused the sidecar once: in its last round. Every broker refused from the
    # moment ActiveMQ did, to the sidecar or to this test's probe, whichever came first.
    amq_label = f"127.0.0.1:{amq.stomp_port}"
    (amq_refused,) = [at for at, b, o in attempts.attempts if (b, o) == (amq_label, "refused")]
    all_refuse = min(probed, amq_refused)
    # While ActiveMQ was down, RabbitMQ refused and the session went on.
    before = [a for a in attempts.attempts if a[0] < all_refuse]
    assert {outcome for _, _, outcome in before} >= {"unreachable", "refused"}
    assert killed < all_refuse <= disconnect_at <= error_at
    last_refusal = max(at for at, _, outcome in attempts.attempts if outcome == "refused")
    assert disconnect_at - all_refuse < 5.0  # one round (<= 0.5 s here), not 300 s
    print(
        f"\nall brokers refuse -> app's DISCONNECT: {disconnect_at - all_refuse:.3f} s "
        f"(ERROR {error_at - all_refuse:.3f} s); the sidecar's last refusal -> DISCONNECT: "
        f"{disconnect_at - last_refusal:.3f} s; kill -> DISCONNECT: "
        f"{disconnect_at - killed:.3f} s; attempts: {event['attempts']}"
    )


def test_a_refusing_broker_is_skipped_while_another_accepts(
    tmp_path: Path, rabbitmq: RabbitMQ
) -> None:
    """Brokers: ActiveMQ 1 (the apps'), RabbitMQ (refuses the app), ActiveMQ 2 (accepts).
    ActiveMQ 1 is killed: the session fails over, RabbitMQ refusing on the way (a 1 s
    cool-down starts), to ActiveMQ 2. An app connecting right after goes to ActiveMQ 2
    without a CONNECT to RabbitMQ: one refusal and one skip in the metrics."""
    first = amq_with_auth(tmp_path, "amq-one", "app-pw")
    second = amq_with_auth(tmp_path, "amq-two", "app-pw")
    try:
        policy = {"retry_interval": "1000", "max_retry_interval": "2000", "jitter": "0"}
        with sidecar_before(first, rabbitmq, second, **policy) as sidecar:
            app, _ = app_on(sidecar.address)
            first.kill()
            app.expect("MESSAGE")  # RECONNECTING
            failover = json.loads(app.expect("MESSAGE", timeout=WAIT).body)
            assert failover["event"] == "FAILOVER"
            assert failover["to_broker"] == f"127.0.0.1:{second.stomp_port}"
            late, _ = app_on(sidecar.address)  # within RabbitMQ's cool-down
            late.conn.send(unique("/queue/refusals"), "x", headers={"receipt": "s1"})
            late.receipt("s1")
            metrics = sidecar.metrics()
            late.close()
            app.close()
    finally:
        second.stop()
        first.stop()

    rmq = f"127.0.0.1:{rabbitmq.stomp_port}"
    refused = sample(metrics, "mq_sidecar_upstream_connect_attempts_total", broker=rmq)
    assert refused == {"refused": 1.0}
    skips = sample(metrics, "mq_sidecar_upstream_refusal_skips_total", broker=rmq)
    assert skips == {"": 1.0}


def sample(text: str, name: str, **labels: str) -> dict[str, float]:
    """The samples of ``name`` with ``labels`` in a text exposition, by their ``outcome``
    label ("" when none), zeros left out."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.value and labels.items() <= s.labels.items():
                found[s.labels.get("outcome", "")] = s.value
    return found
