"""A stream SUBSCRIBE refused because the node's replica is not running yet (RabbitMQ 3.10 after
a node's restart: ``PRECONDITION_FAILED - ... does not have a replica on the local node``) is
tried again on a new connection, for up to the option ``timeout``; any other refusal is not.
Found by ``mq-sidecar drill --consumer spark-stream`` (docs/testing.md, "The stream consumer");
the connection and the SUBSCRIBE are scripted here (the real refusal needs a cluster node's
restart: the drill's own run)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mq_sidecar_spark import _stream_io as stream
from mq_sidecar_spark._stream_options import StreamOptions, parse_stream_options
from mq_sidecar_spark.errors import StompReadError

REFUSED = (
    "SUBSCRIBE to /amq/queue/s failed: the sidecar at 127.0.0.1:1 sent ERROR "
    "precondition_failed: PRECONDITION_FAILED - queue 'queue 's' in vhost '/'' does not have "
    "a replica on the local node"
)


class ScriptedLink:
    def __init__(self) -> None:
        self.closed = False

    def close(self, graceful: bool = True) -> None:
        self.closed = True


def _script(monkeypatch: pytest.MonkeyPatch, refusals: list[str]) -> list[ScriptedLink]:
    links: list[ScriptedLink] = []

    def open_link(options: StreamOptions) -> ScriptedLink:
        links.append(ScriptedLink())
        return links[-1]

    def subscribe(link: Any, options: StreamOptions, *args: Any) -> None:
        if refusals:
            raise StompReadError(refusals.pop(0))

    monkeypatch.setattr(stream, "_open", open_link)
    monkeypatch.setattr(stream, "_subscribe", subscribe)
    return links


def _options(timeout: str = "30s") -> StreamOptions:
    given = {"stream": "true", "destination": "/amq/queue/s", "timeout": timeout}
    return parse_stream_options(given, batch=False)


def test_a_missing_local_replica_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    links = _script(monkeypatch, [REFUSED, REFUSED, REFUSED])
    started = time.monotonic()
    link: Any = stream._open_subscribed(_options(), "t", "offset=0", 10)
    assert link is links[-1]
    assert [lk.closed for lk in links] == [True, True, True, False]
    assert time.monotonic() - started >= 0.7, "waited 0.1, 0.2 and 0.4 s between the tries"


def test_other_refusals_and_a_replica_missing_for_too_long_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    links = _script(monkeypatch, ["SUBSCRIBE to /amq/queue/s failed: ERROR not_found"])
    with pytest.raises(StompReadError, match="not_found"):
        stream._open_subscribed(_options(), "t", "offset=0", 10)
    assert [lk.closed for lk in links] == [True]
    links = _script(monkeypatch, [REFUSED] * 100)
    with pytest.raises(StompReadError, match="does not have a replica"):
        stream._open_subscribed(_options("1s"), "t", "offset=0", 10)
    assert len(links) == 4, "tried at 0, 0.1, 0.3 and 0.7 s; the next would pass the 1 s"
    assert all(lk.closed for lk in links)
