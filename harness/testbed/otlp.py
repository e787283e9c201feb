"""An OTLP/HTTP receiver on loopback for the tracing tests and ``bench.tracing``: the end of
``POST /v1/traces`` as an OpenTelemetry Collector serves it (OTLP specification, "OTLP/HTTP":
a protobuf ``ExportTraceServiceRequest`` body, answered 200 with an empty protobuf), in a
thread. Stdlib only: the bodies are kept as bytes for the caller to decode with
``opentelemetry-proto`` (tests/proxy/test_tracing.py), or only counted (``keep=False``).

No OpenTelemetry Collector is installed for the tests (docs/operations.md, "Traces").
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

__all__ = ["OtlpReceiver"]


class OtlpReceiver:
    """``with OtlpReceiver() as receiver``: listening on ``127.0.0.1:receiver.port`` until the
    block ends. ``bodies``: the request bodies received on ``/v1/traces`` (with ``keep``);
    ``requests``: how many; ``paths``: every other path asked (a misconfigured exporter)."""

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.bodies: list[bytes] = []
        self.requests = 0
        self.paths: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver._took(self.path, body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.port: int = self._server.server_address[1]

    def _took(self, path: str, body: bytes) -> None:
        with self._lock:
            if path != "/v1/traces":
                self.paths.append(path)
                return
            self.requests += 1
            if self.keep:
                self.bodies.append(body)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
