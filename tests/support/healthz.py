"""A live worker's metrics port, played by a test: it answers ``GET /healthz`` with 200."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator


class _Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(ip: str, port: int = 0) -> Iterator[int]:
    """Serve /healthz on ``ip:port`` (0: any free port) in a thread; yields the port."""
    server = http.server.ThreadingHTTPServer((ip, port), _Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
