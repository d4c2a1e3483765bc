"""Liveness and readiness endpoints (port 8081 by default).

``/healthz`` answers 200 while the event loop runs: a wedged loop cannot
answer, so the kubelet's liveness probe restarts the process. ``/readyz``
answers 200 once the replica knows its role: leading with its watches
started (kopf's ready flag), or standing by for the Lease (or holding it while
kopf starts); 503 before that.

Why not prometheus_client's server (which serves /metrics on its own port,
main.py): it answers from a thread, so it would say "alive" while the event
loop is wedged. These endpoints run on the loop itself, on aiohttp, which the
operator already uses for its API client.
"""

from __future__ import annotations

import json

from aiohttp import web


class Health:
    def __init__(self) -> None:
        self.role = "starting"  # starting | standby | leader

    @property
    def ready(self) -> bool:
        return self.role in ("standby", "leader")

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _request: web.Request) -> web.Response:
        body = json.dumps({"role": self.role}) + "\n"
        return web.Response(text=body, status=200 if self.ready else 503, content_type="application/json")

    async def serve(self, port: int) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "0.0.0.0", port).start()
        return runner
