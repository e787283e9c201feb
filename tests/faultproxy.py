"""A TCP fault proxy for tests: sits between the sidecar and a broker and misbehaves on demand.

Userspace and loopback-only (``tc netem`` is not available on the project's machines, and a
proxy needs no root: docs/testing.md, "Faults"). It runs its own trio loop in a background
thread so synchronous tests (stomp.py) can switch modes at any moment:

- ``pass_through()``: forward both ways (the default);
- ``blackhole()``: stop forwarding in both directions but keep every socket open (a broker or
  link that died without a FIN or RST: only heart-beats can detect it);
- ``reset()``: close every proxied connection with an RST (SO_LINGER 0);
- ``refuse(True)``: reset every new connection at once (a broker that is down);
- ``cut_after(n)``: forward ``n`` more bytes toward the broker, then reset.
- ``slow(delay_s, bytes_per_s)``: a slow link, both ways: every chunk is held ``delay_s`` plus
  its size over ``bytes_per_s`` before it is forwarded (``pass_through()`` ends it).

Every connection and pump task lives in the proxy's own nursery; ``close()`` ends them all.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from typing import Self

import trio

__all__ = ["FaultProxy"]

_WAIT = 10.0


def _rst(stream: trio.SocketStream) -> None:
    """Make the next close send an RST instead of a FIN (no-op on a closed socket)."""
    with contextlib.suppress(OSError):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _Link:
    def __init__(self, client: trio.SocketStream, server: trio.SocketStream) -> None:
        self.client = client
        self.server = server
        self.scope = trio.CancelScope()

    async def abort(self) -> None:
        for stream in (self.client, self.server):
            _rst(stream)
            await trio.aclose_forcefully(stream)
        self.scope.cancel()


class FaultProxy:
    """Proxy ``127.0.0.1:<port>`` → ``target``; use as a context manager.

    Attributes:
        port: the proxy's own listening port (connect the sidecar here).
        connections_total: connections accepted so far.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.connections_total = 0
        self._mode = "pass"
        self._refuse = False
        self._cut_budget: int | None = None
        self._slow: tuple[float, float] | None = None  # (delay s, bytes/s) while "slow"
        self._mode_changed: trio.Event | None = None
        self._links: set[_Link] = set()
        self._streams: set[trio.SocketStream] = set()  # every socket opened, until closed
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="faultproxy", daemon=True)

    # -- control (called from the test thread) ------------------------------------------------

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(_WAIT) or self._error is not None:
            raise RuntimeError(f"fault proxy did not start: {self._error!r}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, fn: object) -> None:
        assert callable(fn)
        trio.from_thread.run_sync(fn, trio_token=self._token)

    def pass_through(self) -> None:
        """Forward everything again (also ends ``refuse``)."""
        self._call(lambda: self._set_mode("pass", refuse=False))

    def blackhole(self) -> None:
        """Stop forwarding both ways; sockets stay open."""
        self._call(lambda: self._set_mode("blackhole"))

    def slow(self, delay_s: float, bytes_per_s: float) -> None:
        """A slow link until ``pass_through()``: each chunk read (up to 64 KiB), either way,
        waits ``delay_s`` seconds plus ``len(chunk) / bytes_per_s`` before it is forwarded.

        Raises ValueError for a negative delay or a rate that is not positive.
        """
        if delay_s < 0 or bytes_per_s <= 0:
            raise ValueError(f"slow({delay_s}, {bytes_per_s}): need delay >= 0 and rate > 0")

        def arm() -> None:
            self._slow = (delay_s, bytes_per_s)
            self._set_mode("slow")

        self._call(arm)

    def refuse(self, on: bool = True) -> None:
        """Reset new connections at once while ``on``."""
        self._call(lambda: self._set_mode(self._mode, refuse=on))

    def cut_after(self, n: int) -> None:
        """Forward ``n`` more bytes toward the target, then reset every connection."""

        def arm() -> None:
            self._cut_budget = n

        self._call(arm)

    def reset(self) -> None:
        """Reset every proxied connection now."""
        trio.from_thread.run(self._reset_all, trio_token=self._token)

    def close(self) -> None:
        """Stop the proxy and close every connection."""
        if self._thread.is_alive() and self._stop is not None:
            self._call(self._stop.set)
        self._thread.join(_WAIT)
        if self._error is not None:
            raise self._error

    # -- trio side ----------------------------------------------------------------------------

    def _set_mode(self, mode: str, *, refuse: bool | None = None) -> None:
        self._mode = mode
        if refuse is not None:
            self._refuse = refuse
        assert self._mode_changed is not None
        self._mode_changed.set()
        self._mode_changed = trio.Event()

    async def _reset_all(self) -> None:
        for link in list(self._links):
            await link.abort()
        self._links.clear()

    def _main(self) -> None:
        try:
            trio.run(self._amain)
        except BaseException as exc:  # reported to the test thread by close()
            self._error = exc
            self._ready.set()

    async def _amain(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        self._mode_changed = trio.Event()
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        listener = listeners[0]
        self.port = listener.socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._accept, listener, nursery)
            self._ready.set()
            await self._stop.wait()
            await self._reset_all()
            nursery.cancel_scope.cancel()
        await listener.aclose()
        for stream in self._streams:
            await trio.aclose_forcefully(stream)

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            client = await listener.accept()
            self._streams.add(client)
            self.connections_total += 1
            if self._refuse:
                _rst(client)
                await trio.aclose_forcefully(client)
                continue
            try:
                server = await trio.open_tcp_stream(*self.target)
                self._streams.add(server)
            except OSError:
                _rst(client)
                await trio.aclose_forcefully(client)
                continue
            link = _Link(client, server)
            self._links.add(link)
            nursery.start_soon(self._serve, link)

    async def _serve(self, link: _Link) -> None:
        with link.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, link, link.client, link.server, True)
                nursery.start_soon(self._pump, link, link.server, link.client, False)
        self._links.discard(link)
        await trio.aclose_forcefully(link.client)
        await trio.aclose_forcefully(link.server)

    async def _pump(
        self, link: _Link, src: trio.SocketStream, dst: trio.SocketStream, to_target: bool
    ) -> None:
        try:
            while True:
                while self._mode == "blackhole":
                    assert self._mode_changed is not None
                    await self._mode_changed.wait()
                data = await src.receive_some(65536)
                if not data:
                    await dst.send_eof()
                    return
                if self._mode == "slow" and self._slow is not None:
                    delay, rate = self._slow
                    await trio.sleep(delay + len(data) / rate)
                while self._mode == "blackhole":  # switched while we were reading: hold it
                    assert self._mode_changed is not None
                    await self._mode_changed.wait()
                if to_target and self._cut_budget is not None:
                    allowed = max(0, self._cut_budget)
                    if len(data) >= allowed:
                        self._cut_budget = None
                        if allowed:
                            await dst.send_all(data[:allowed])
                        await self._reset_all()
                        return
                    self._cut_budget -= len(data)
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            link.scope.cancel()
