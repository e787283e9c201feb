"""SessionState: pure bookkeeping of ids, subscriptions, deliveries and transactions."""

from __future__ import annotations

import pytest

from protocol import Command, Frame
from proxy.tracking import SessionError, SessionState


def frame(command: Command, body: bytes = b"", **headers: str) -> Frame:
    return Frame.build(command, {k.replace("_", "-"): v for k, v in headers.items()}, body)


def state(version: str = "1.2", **kwargs: int) -> SessionState:
    return SessionState(
        "S",
        version,
        max_subscriptions=kwargs.get("subs", 10),
        max_unacked=kwargs.get("unacked", 100),
    )


def message(sub: str, mid: str, ack: str | None = None) -> Frame:
    headers = {"destination": "/queue/a", "message-id": mid, "subscription": sub}
    if ack is not None:
        headers["ack"] = ack
    return Frame.build(Command.MESSAGE, headers, b"x")


def test_receipts_are_mapped_and_resolved_once() -> None:
    st = state()
    out = st.map_receipt(frame(Command.SEND, destination="/q", receipt="mine"))
    own = out.get("receipt")
    assert own is not None
    assert own != "mine"
    assert own.startswith("S-")
    assert st.pending_receipts == 1
    assert st.take_receipt(own) == (True, "mine")
    assert st.take_receipt(own) == (False, None)
    internal = st.new_receipt(None)
    assert st.take_receipt(internal) == (True, None)


def test_frames_without_receipt_are_unchanged() -> None:
    st = state()
    f = frame(Command.SEND, destination="/q")
    assert st.map_receipt(f) is f


def test_subscribe_keeps_app_id_and_headers_without_receipt() -> None:
    st = state()
    up = st.subscribe(
        frame(
            Command.SUBSCRIBE,
            destination="/topic/t",
            id="d1",
            ack="client",
            selector="a = 1",
            receipt="r",
        )
    )
    assert up.get("id") == "d1"
    assert up.get("selector") == "a = 1"
    assert not up.has("receipt")
    assert list(st.iter_subscribe_frames()) == [up]
    with pytest.raises(SessionError, match="already in use"):
        st.subscribe(frame(Command.SUBSCRIBE, destination="/q", id="d1"))


def test_stomp10_subscription_without_id_gets_one() -> None:
    st = state("1.0")
    up = st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/a"))
    assert up.get("id") == "S-s1"
    out = st.deliver(message("S-s1", "m1"))
    assert not out.has("subscription")  # the 1.0 app never named it
    sub = st.unsubscribe(frame(Command.UNSUBSCRIBE, destination="/queue/a"))
    assert sub is not None
    assert sub.upstream_id == "S-s1"


def test_limits_on_subscriptions_and_ack_modes() -> None:
    st = state(subs=1)
    st.subscribe(frame(Command.SUBSCRIBE, destination="/q", id="1"))
    with pytest.raises(SessionError, match="too many subscriptions"):
        st.subscribe(frame(Command.SUBSCRIBE, destination="/q", id="2"))
    with pytest.raises(SessionError, match="unknown ack mode"):
        state().subscribe(frame(Command.SUBSCRIBE, destination="/q", id="1", ack="sometimes"))


def test_delivery_gets_sidecar_ack_id_and_maps_back() -> None:
    st = state()
    st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/a", id="s", ack="client-individual"))
    out = st.deliver(message("s", "ID:broker-1", ack="ID:broker-ack-1"))
    assert out.get("ack") == "1"
    assert out.get("subscription") == "s"
    assert st.unacked == 1
    app_ack = frame(Command.ACK, id="1", receipt="r9")
    delivery = st.settle(app_ack)
    assert st.unacked == 0
    up12 = st.upstream_ack(app_ack, delivery, "1.2")
    assert up12.get("id") == "ID:broker-ack-1"
    assert up12.get("receipt") == "r9"
    up11 = st.upstream_ack(app_ack, delivery, "1.1")
    assert (up11.get("message-id"), up11.get("subscription"), up11.has("id")) == (
        "ID:broker-1",
        "s",
        False,
    )
    up10 = st.upstream_ack(app_ack, delivery, "1.0")
    assert up10.get("message-id") == "ID:broker-1"
    assert not up10.has("subscription")
    with pytest.raises(SessionError, match="unknown ack id '1'"):
        st.settle(app_ack)


def test_auto_mode_needs_no_ack() -> None:
    st = state()
    st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/a", id="s"))
    out = st.deliver(message("s", "m1", ack="whatever"))
    assert not out.has("ack")
    assert st.unacked == 0


def test_client_mode_ack_is_cumulative() -> None:
    st = state()
    st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/a", id="s", ack="client"))
    ids = [st.deliver(message("s", f"m{i}", ack=f"a{i}")).get("ack") for i in range(3)]
    st.settle(frame(Command.ACK, id=str(ids[1])))
    assert st.unacked == 1
    with pytest.raises(SessionError):
        st.settle(frame(Command.ACK, id=str(ids[0])))
    st.settle(frame(Command.ACK, id=str(ids[2])))
    assert st.unacked == 0


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_older_apps_ack_by_message_id(version: str) -> None:
    st = state(version)
    st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/a", id="s", ack="client-individual"))
    out = st.deliver(message("s", "m1", ack="broker-ack"))
    assert not out.has("ack")
    ack = frame(Command.ACK, message_id="m1", subscription="s")
    assert st.settle(ack).upstream_ack == "broker-ack"


def test_unsubscribe_forgets_deliveries() -> None:
    st = state()
    st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/a", id="s", ack="client"))
    st.deliver(message("s", "m1", ack="a"))
    st.unsubscribe(frame(Command.UNSUBSCRIBE, id="s"))
    assert st.unacked == 0
    assert st.unsubscribe(frame(Command.UNSUBSCRIBE, id="s")) is None


def test_messages_for_unknown_subscriptions_pass_through() -> None:
    st = state()
    m = message("/temp-queue/replies", "m1")
    assert st.deliver(m) is m


def test_transactions_record_their_frames() -> None:
    st = state()
    st.begin(frame(Command.BEGIN, transaction="t"))
    with pytest.raises(SessionError, match="already open"):
        st.begin(frame(Command.BEGIN, transaction="t"))
    send = frame(Command.SEND, destination="/q", transaction="t")
    st.record_in_transaction(send)
    st.record_in_transaction(frame(Command.SEND, destination="/q"))  # not transactional
    assert st.transactions["t"].frames == [send]
    with pytest.raises(SessionError, match="is not open"):
        st.record_in_transaction(frame(Command.SEND, destination="/q", transaction="other"))
    assert st.end(frame(Command.COMMIT, transaction="t")).frames == [send]
    with pytest.raises(SessionError, match="is not open"):
        st.end(frame(Command.ABORT, transaction="t"))
