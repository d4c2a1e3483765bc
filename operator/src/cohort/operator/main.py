"""The ``cohort-operator`` entry point: settings, metrics, health, leader election, kopf.

Start-up order: serve /metrics and /healthz, wait until the API server
serves TrainingJobs, wait for the Lease (unless ``--standalone``), then run
kopf (the watches) together with the reconcile workers, the periodic resync
and the prober. Losing the Lease stops
everything and exits non-zero, so the pod restarts as a standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Sequence

import kopf

from cohort.api.models import GROUP, PLURAL, VERSION

from .events import EventRecorder
from .handlers import build_registry, configure
from .health import Health
from .kubeapi import ApiError, Kube
from .kueue import WORKLOAD
from .leader import LeaderElector
from .metrics import OperatorMetrics
from .prober import Prober
from .reconciler import Reconciler
from .settings import Settings, load_settings

log = logging.getLogger("cohort.operator")
EXIT_LOST_LEASE = 3


async def run(settings: Settings) -> int:
    metrics = OperatorMetrics()
    metrics.serve(settings.metrics_port)
    health = Health()
    runner = await health.serve(settings.health_port)
    kube = Kube.from_environment(concurrency=settings.api_concurrency)
    try:
        await wait_until_served(kube)  # before the Lease: a leader must be ready to act
        elector = None
        if not settings.standalone:
            elector = LeaderElector(kube, settings.lease_namespace, settings.lease_name, settings.identity,
                                    settings.lease_s)
            health.role = "standby"
            await elector.acquire()
        return await _lead(settings, kube, metrics, elector, health)
    finally:
        await kube.close()
        await runner.cleanup()


async def wait_until_served(kube: Kube, *, group: str = GROUP, version: str = VERSION, plural: str = PLURAL,
                            poll_s: float = 0.5, warn_every_s: float = 30.0) -> None:
    """Return once API discovery lists TrainingJobs (or ``plural`` in ``group/version``).

    kopf finds custom resources by reading discovery at its start and again on
    each CRD event. A CRD created a moment before the operator starts (a fresh
    `helm install` with crds.enabled, `make demo`) can be served in discovery
    only after its last event, and kopf would then never watch TrainingJobs.
    """
    path, warned = f"/apis/{group}/{version}", 0.0
    while True:
        try:
            found = await kube.get(path)
        except (ApiError, OSError, asyncio.TimeoutError) as e:
            found = None
            log.debug("discovery of %s failed: %r", path, e)
        if found and any(r.get("name") == plural for r in found.get("resources") or []):
            return
        if time.monotonic() - warned >= warn_every_s:
            log.warning("waiting for the API server to serve %s.%s/%s (is the CRD installed? make crds; "
                        "the chart's crds.enabled)", plural, group, version)
            warned = time.monotonic()
        await asyncio.sleep(poll_s)


async def _lead(settings: Settings, kube: Kube, metrics: OperatorMetrics, elector: LeaderElector | None,
                health: Health) -> int:
    recorder = EventRecorder(kube, metrics, settings.identity)
    rec = Reconciler(kube, settings, metrics, recorder)
    prober = Prober(rec)
    # Kueue's Workloads are watched where Kueue is installed (docs/kueue.md); a
    # cluster that gains Kueue later needs an operator restart for the watch.
    kueue = (WORKLOAD.api_version, WORKLOAD.plural) in await kube.served_resources(WORKLOAD.api_version)
    kopf_settings = kopf.OperatorSettings()
    configure(kopf_settings, settings.instance, kueue=kueue)
    # Every task of ours exists before kopf starts: on shutdown kopf cancels
    # the tasks it did not find at its start, and ours stop in our own order.
    workers = rec.queue.start(rec.reconcile, settings.max_concurrent_reconciles)
    workers += recorder.start(busy=lambda: len(rec.queue) > 0)
    workers += [asyncio.create_task(rec.resync_forever(), name="resync"),
                asyncio.create_task(prober.run(), name="prober")]
    if elector is not None:
        workers.append(asyncio.create_task(elector.hold(), name="lease"))
    watching: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    operator = asyncio.create_task(kopf.operator(
        # No stop_flag: kopf leaves its waiter for one pending after a SIGTERM and waits
        # 5 s for it as a hung task (kopf/_core/reactor/running.py). We cancel kopf instead.
        registry=build_registry(rec, kueue=kueue), settings=kopf_settings, ready_flag=watching,
        clusterwide=settings.clusterwide, namespaces=list(settings.namespaces)), name="kopf")
    # /readyz says "leader" once kopf runs its watches (it raises the flag when it unfreezes them, after
    # its startup handlers), not when the Lease is won: until then this replica acts on nothing.
    watching.add_done_callback(lambda f: setattr(health, "role", "leader") if not f.cancelled() else None)
    watched = [operator, *workers]
    code = 0
    try:
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finished = done.pop()
        if finished.get_name() == "lease":
            log.error("leadership lost: stopping")
            code = EXIT_LOST_LEASE
        elif finished is not operator:
            error = None if finished.cancelled() else finished.exception()
            log.error("task %s ended unexpectedly: %r", finished.get_name(), error)
            code = 1
    finally:
        for t in watched:
            t.cancel()  # kopf too: it stops its own tasks as the cancellation unwinds it
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.gather(*watched, return_exceptions=True), timeout=10)
        await prober.close()
        if elector is not None and code != EXIT_LOST_LEASE and all(t.done() for t in watched):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(elector.release(), timeout=5)  # nothing of ours acts any more
    return code


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(argv)
    except ValueError as e:
        print(f"cohort-operator: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf").setLevel(max(logging.WARNING, logging.getLogger().level))
    log.info("starting: %s", settings)
    try:
        return asyncio.run(run(settings))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
