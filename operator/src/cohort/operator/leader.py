"""Leader election with a coordination.k8s.io Lease, so two replicas are safe together.

Only the leader runs kopf and the reconciler; a standby waits for the Lease.
The leader renews every third of the lease duration. A standby takes the
Lease when its ``renewTime`` is older than the duration (the leader died or
is cut off) or empty (the leader stopped cleanly and released it); writes use
the Lease's resourceVersion, so two standbys cannot both win. A leader that
cannot renew within the duration stops working before anyone else may take
over: it exits, and its pod restarts as a standby.

The decision of what to write is :func:`claim`, a pure function.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from typing import Any

from .kubeapi import ApiError, Kube
from .lifecycle import fmt_micro_time, parse_time
from .manifests import LEASE

log = logging.getLogger(__name__)


def claim(lease: dict[str, Any] | None, identity: str, duration_s: float, now: dt.datetime) -> dict[str, Any] | None:
    """The Lease spec to write to hold the lease, or None if someone else validly holds it."""
    spec = dict((lease or {}).get("spec") or {})
    holder = spec.get("holderIdentity") or ""
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    held_by_other = holder and holder != identity
    expired = renewed is None or (now - renewed).total_seconds() > float(spec.get("leaseDurationSeconds") or duration_s)
    if held_by_other and not expired:
        return None
    out = dict(spec)
    if holder != identity:
        out["acquireTime"] = fmt_micro_time(now)
        out["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
    out["holderIdentity"] = identity
    out["leaseDurationSeconds"] = max(int(duration_s), 1)
    out["renewTime"] = fmt_micro_time(now)
    return out


@dataclasses.dataclass
class LeaderElector:
    kube: Kube
    namespace: str
    name: str
    identity: str
    duration_s: float
    is_leader: bool = False

    @property
    def path(self) -> str:
        return LEASE.path(self.namespace, self.name)

    async def try_acquire(self) -> bool:
        """One attempt to take or renew the lease."""
        now = dt.datetime.now(dt.timezone.utc)
        current = await self.kube.get(self.path)
        spec = claim(current, self.identity, self.duration_s, now)
        if spec is None:
            return False
        try:
            if current is None:
                await self.kube.create(LEASE.path(self.namespace), {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec})
            else:
                body = {**current, "spec": spec}
                await self.kube.replace(self.path, body)  # carries resourceVersion: optimistic lock
        except ApiError as e:
            if e.status in (409, 422):
                return False  # someone else wrote first
            raise
        return True

    async def acquire(self) -> None:
        """Wait until this replica leads."""
        logged = False
        while True:
            try:
                if await self.try_acquire():
                    self.is_leader = True
                    log.info("leading as %s (Lease %s/%s)", self.identity, self.namespace, self.name)
                    return
            except (ApiError, OSError, asyncio.TimeoutError) as e:
                log.warning("leader election: %s", e)
            if not logged:
                log.info("standing by: Lease %s/%s is held by another replica", self.namespace, self.name)
                logged = True
            await asyncio.sleep(max(self.duration_s / 5, 0.5))

    async def release(self) -> None:
        """Give the Lease up on a clean stop (SIGTERM: a rolling update, a drain), as client-go's
        ReleaseOnCancel does: a standby then takes it at its next try, not a lease duration later.
        Call it only once this replica has stopped acting. Best effort: the Lease expires anyway."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            current = await self.kube.get(self.path)
            spec = (current or {}).get("spec") or {}
            if current is None or spec.get("holderIdentity") != self.identity:
                return
            released = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1,
                        "renewTime": fmt_micro_time(dt.datetime.now(dt.timezone.utc))}
            await self.kube.replace(self.path, {**current, "spec": released})
            log.info("released the Lease %s/%s", self.namespace, self.name)
        except (ApiError, OSError, asyncio.TimeoutError) as e:
            log.warning("could not release the Lease (it expires in %.0fs): %s", self.duration_s, e)

    async def hold(self) -> None:
        """Renew until renewal fails for a whole lease duration; then return (leadership lost)."""
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(max(self.duration_s / 3, 0.3))
            try:
                if await self.try_acquire():
                    last_ok = time.monotonic()
                    continue
                log.error("lost the Lease to another replica")
                break
            except (ApiError, OSError, asyncio.TimeoutError) as e:
                log.warning("could not renew the Lease: %s", e)
            # Stop a little before the lease runs out, so that two leaders never overlap.
            if time.monotonic() - last_ok > self.duration_s * 0.8:
                log.error("could not renew the Lease for %.0fs", self.duration_s)
                break
        self.is_leader = False
