"""Exactly once downstream across a restart of the consumer's sidecar (issue 17 part 3,
docs/behaviour.md "Duplicate detection"), on scripted brokers with a real outbox in a
temporary directory: the ``mq-sidecar-id`` s of what the app settled on a queue are persisted
through the group committer, and a SUBSCRIBE after the outbox is opened again seeds its seen
ids from them, so a copy is hidden (acknowledged upstream) and a new message is shown. The
outbox's writes run in a worker thread, so these run on the real clock: every wait is bounded
(scripted_broker.WAIT)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from protocol import Command, Frame
from proxy.outbox.service import OutboxService, open_outbox
from tests.proxy.scripted_broker import (
    AppClient,
    Network,
    ScriptedBroker,
    make_config,
    start_session,
    wait_until,
)

QUEUE = "/queue/orders"


@asynccontextmanager
async def _consumer(
    network: Network, broker: ScriptedBroker, tmp_path: Path, ack: str
) -> AsyncIterator[tuple[OutboxService, AppClient]]:
    """A sidecar in outbox mode on ``tmp_path`` with one session whose app subscribed to
    :data:`QUEUE` (``ack`` mode); the sidecar stops (its outbox closes) on the way out."""
    config = make_config(broker, outbox=True, outbox_dir=str(tmp_path))
    async with open_outbox(config) as outbox, trio.open_nursery() as nursery:
        running = await start_session(nursery, network, config, outbox=outbox)
        app = running.app
        assert (await app.connect()).command is Command.CONNECTED
        await app.send(
            Command.SUBSCRIBE, {"destination": QUEUE, "id": "sub", "ack": ack, "receipt": "sub"}
        )
        await app.wait_receipt("sub")
        yield outbox, app
        nursery.cancel_scope.cancel()


async def _deliver(broker: ScriptedBroker, n: int, sidecar_id: str) -> str:
    """One copy: its own broker message-id, the producer's ``mq-sidecar-id``."""
    return await broker.link.deliver(
        QUEUE,
        b"body-" + sidecar_id.encode(),
        message_id=f"ID:m{n}",
        headers=[("mq-sidecar-id", sidecar_id)],
    )


async def _two_shown(app: AppClient, broker: ScriptedBroker) -> list[Frame]:
    """p-1 and p-2 delivered; returns them as the app got them."""
    await _deliver(broker, 1, "p-1")
    await _deliver(broker, 2, "p-2")
    await app.signal.wait_until(lambda: len(app.messages(QUEUE)) == 2)
    return app.messages(QUEUE)


async def _restarted_consumer_hides_copies(
    network: Network, broker: ScriptedBroker, tmp_path: Path, ack: str
) -> None:
    """The second half: the outbox opened again on the same directory, a new session
    subscribes, copies of p-1 and p-2 and a new p-3 arrive: only p-3 is shown."""
    async with _consumer(network, broker, tmp_path, ack) as (outbox, app):
        assert await outbox.committer.seen_ids(QUEUE) == ("p-1", "p-2")
        copy_acks = [await _deliver(broker, 11, "p-1"), await _deliver(broker, 12, "p-2")]
        await _deliver(broker, 13, "p-3")
        await app.signal.wait_until(lambda: len(app.messages(QUEUE)) == 1)
        (shown,) = app.messages(QUEUE)
        assert shown.body == b"body-p-3"
        assert shown.get("mq-sidecar-id") is None  # never shown to the app
        # The copies were acknowledged upstream by the sidecar, on the link that has them.
        await wait_until(lambda: len(broker.link.received(Command.ACK)) >= 2)
        acked = [f.get("id") for f in broker.link.received(Command.ACK)]
        assert acked[:2] == copy_acks
        if ack != "auto":
            await app.send(Command.ACK, {"id": shown.get("ack") or "", "receipt": "a3"})
            await app.wait_receipt("a3")
        await wait_until(lambda: outbox.seen.recorded == 1)
        assert app.errors() == []
    assert len(app.messages(QUEUE)) == 1


async def test_acked_ids_are_persisted_and_hide_copies_after_a_restart(
    network: Network, tmp_path: Path
) -> None:
    broker = network.add("only", 61001)
    async with _consumer(network, broker, tmp_path, "client-individual") as (outbox, app):
        first, second = await _two_shown(app, broker)
        await app.send(Command.ACK, {"id": first.get("ack") or "", "receipt": "a1"})
        await app.wait_receipt("a1")
        assert await outbox.committer.seen_ids(QUEUE) in ((), ("p-1",))  # trails the ACK
        await app.send(Command.ACK, {"id": second.get("ack") or "", "receipt": "a2"})
        await app.wait_receipt("a2")
        await wait_until(lambda: outbox.seen.recorded == 2)
        assert await outbox.committer.seen_ids(QUEUE) == ("p-1", "p-2")
    await _restarted_consumer_hides_copies(network, broker, tmp_path, "client-individual")


async def test_an_unacknowledged_message_is_not_persisted(network: Network, tmp_path: Path) -> None:
    """A message the app held unacknowledged when its sidecar stopped comes back after the
    restart (the broker redelivers it) and must be shown: only ACKed ids are persisted."""
    broker = network.add("only", 61001)
    for _ in range(2):  # the second time, after the restart: the redelivery
        async with _consumer(network, broker, tmp_path, "client-individual") as (outbox, app):
            assert await outbox.committer.seen_ids(QUEUE) == ()
            await _deliver(broker, 1, "p-1")
            await app.signal.wait_until(lambda: len(app.messages(QUEUE)) == 1)


async def test_an_auto_subscription_persists_what_it_showed(
    network: Network, tmp_path: Path
) -> None:
    broker = network.add("only", 61001)
    async with _consumer(network, broker, tmp_path, "auto") as (outbox, app):
        commits_before = outbox.committer.statistics().commits
        await _two_shown(app, broker)
        await wait_until(lambda: outbox.seen.recorded == 2)
        # Batched: never more than one commit per message, and no waiting MESSAGE for it.
        assert outbox.committer.statistics().commits - commits_before <= 2
    await _restarted_consumer_hides_copies(network, broker, tmp_path, "auto")
