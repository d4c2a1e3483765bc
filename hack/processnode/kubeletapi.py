"""The slice of the kubelet's HTTPS API that ``kubectl logs`` needs.

The API server proxies ``kubectl logs`` to ``https://<node InternalIP>:<kubelet
port>/containerLogs/<ns>/<pod>/<container>``, so the daemon serves that (and
``/healthz``) from the container log files, with ``tailLines``, ``limitBytes``
and ``follow``. Everything else the kubelet serves (exec, attach,
port-forward, stats) answers 501. The local API server does not verify kubelet
certificates, so a self-signed one made with openssl is enough.
"""

from __future__ import annotations

import logging
import re
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("processnode.kubeletapi")
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def ensure_cert(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "kubelet.crt", directory / "kubelet.key"
    if not (cert.exists() and key.exists()):
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(cert), "-days", "3650", "-subj", "/CN=processnode",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        key.chmod(0o600)
    return cert, key


class KubeletServer:
    """Serves container logs; ``running(ns, pod, container)`` says whether more output may come."""

    def __init__(self, logs_dir: Path, cert_dir: Path, running: Callable[[str, str, str], bool]):
        self.logs_dir, self.running = logs_dir, running
        cert, key = ensure_cert(cert_dir)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("kubelet api: " + fmt, *args)

            def do_GET(self) -> None:
                server.handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]

    def start(self) -> None:
        threading.Thread(target=self.httpd.serve_forever, name="kubelet-api", daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        url = urlsplit(req.path)
        parts = url.path.strip("/").split("/")
        if parts == ["healthz"]:
            return self._reply(req, 200, b"ok")
        if len(parts) != 4 or parts[0] != "containerLogs" or not all(NAME.match(p) for p in parts[1:]):
            return self._reply(req, 501, f"{url.path}: not supported on process nodes (only logs)\n".encode())
        ns, pod, container = parts[1:]
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if q.get("previous") == "true":
            return self._reply(req, 400, b"previous: not supported on process nodes; the log holds every run\n")
        path = self.logs_dir / f"{ns}_{pod}_{container}.log"
        if not path.exists():
            return self._reply(req, 404, f"no log for container {container} of {ns}/{pod}\n".encode())
        data = path.read_bytes()
        offset = len(data)
        if q.get("tailLines"):
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(q["tailLines"]):]) if int(q["tailLines"]) > 0 else b""
        limit = int(q["limitBytes"]) if q.get("limitBytes") else None
        req.send_response(200)
        req.send_header("Content-Type", "text/plain; charset=utf-8")
        req.send_header("Connection", "close")
        req.end_headers()
        req.close_connection = True
        try:
            sent = self._write(req, data, limit, 0)
            if q.get("follow") != "true":
                return
            while limit is None or sent < limit:
                alive = self.running(ns, pod, container)
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                offset += len(chunk)
                sent = self._write(req, chunk, limit, sent)
                if not alive and not chunk:
                    return
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            return

    @staticmethod
    def _write(req: BaseHTTPRequestHandler, data: bytes, limit: int | None, sent: int) -> int:
        if limit is not None:
            data = data[:max(0, limit - sent)]
        if data:
            req.wfile.write(data)
            req.wfile.flush()
        return sent + len(data)

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, code: int, body: bytes) -> None:
        req.send_response(code)
        req.send_header("Content-Type", "text/plain; charset=utf-8")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
