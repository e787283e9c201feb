"""A byte relay in Python on trio, the floor of a Python/trio relay on this machine.

``python -m bench.trio_relay --port PORT --broker HOST:PORT``: for every connection accepted on
127.0.0.1:``PORT`` it opens one to the broker and runs two tasks in a nursery, each copying
whatever one side sends to the other (``receive_some(65536)`` then ``send_all``) until EOF.
No STOMP, no state, no heart-beats: what any trio relay pays per session (two sockets, two
tasks, a nursery) and per round trip (two wakeups, a read and a write per leg), which
``bench.floor`` sets beside the sidecar. :class:`TrioRelayProcess` runs it as a child process
with :class:`bench.relay.RelayProcess`'s start, stop and parent-death handling.
"""

from __future__ import annotations

import argparse
import sys

import trio

from bench.relay import RelayProcess

__all__ = ["TrioRelayProcess", "main"]

#: Bytes asked of the kernel per read (the sidecar's ``proxy.legs.stream.RECEIVE_SIZE``).
RECEIVE_SIZE = 65536


async def _pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    try:
        while data := await source.receive_some(RECEIVE_SIZE):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(sink)


async def _relay(host: str, port: int, app: trio.SocketStream) -> None:
    try:
        broker = await trio.open_tcp_stream(host, port)
    except OSError:
        await trio.aclose_forcefully(app)
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_pump, app, broker)
        nursery.start_soon(_pump, broker, app)


async def _serve(listen_port: int, host: str, port: int) -> None:
    await trio.serve_tcp(lambda app: _relay(host, port, app), listen_port, host="127.0.0.1")


def main(argv: list[str] | None = None) -> int:
    """Relay until killed. Exits 2 for a bad ``--broker``."""
    parser = argparse.ArgumentParser(prog="python -m bench.trio_relay", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="listening port on 127.0.0.1")
    parser.add_argument("--broker", required=True, help="HOST:PORT of the broker")
    args = parser.parse_args(argv)
    host, _, port = args.broker.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--broker must be HOST:PORT, not {args.broker!r}")
    trio.run(_serve, args.port, host, int(port))
    return 0


class TrioRelayProcess(RelayProcess):
    """:func:`main` as a child process (``python -m bench.trio_relay``) relaying
    127.0.0.1:``port`` to the broker; one process for every connection (``pid`` carries them
    all, unlike socat's forked children)."""

    def command(self, port: int) -> list[str]:
        """The command line for listening port ``port``."""
        broker = f"{self.broker_host}:{self.broker_port}"
        return [sys.executable, "-m", "bench.trio_relay", "--port", str(port), "--broker", broker]


if __name__ == "__main__":
    sys.exit(main())
