"""A live worker's metrics port, played by a test: it answers ``GET /healthz`` with 200 (and ``/progress``
with a given document)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator


class _Healthz(http.server.BaseHTTPRequestHandler):
    progress: dict | None = None

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        if self.path.split("?")[0] == "/progress" and self.progress is not None:  # a query: ledgerAt (§4)
            self.wfile.write(json.dumps(self.progress).encode())

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(ip: str, port: int = 0, progress: dict | None = None) -> Iterator[int]:
    """Serve /healthz (and ``progress`` as /progress) on ``ip:port`` (0: any free port) in a thread; yields
    the port."""
    handler = type("Handler", (_Healthz,), {"progress": progress})
    server = http.server.ThreadingHTTPServer((ip, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
