"""The objects a job owns besides its pods: created if absent, recreated if deleted, kept current.

The job config ConfigMap (patched when the spec changes), the world ConfigMap
(the membership authority's record; docs/contracts.md §3), the Service, RBAC,
PodDisruptionBudget, NetworkPolicy and the gang object. Each is remembered as
ensured (``JobMemory.ensured``), so a steady reconcile makes no API call; a
deletion seen by a watch or the resync marks it lost, and the next reconcile
recreates it and says so in an Event.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

from cohort.api.models import TrainingJobSpec

from .events import EventRecorder
from .gang import DISCOVERY_GROUP_VERSIONS, GangApi, build_gang_object, choose_gang_api, gang_message, gang_pod_fields
from .jobstate import JobMemory
from .kubeapi import ApiError, Kube
from .lifecycle import get_condition, set_condition
from .manifests import CONFIG_MAP, build_world_map, kind_of
from .naming import CONFIG_KEY, world_map_name
from .settings import Settings
from .world import World


class OwnedObjects:
    def __init__(self, kube: Kube, settings: Settings, recorder: EventRecorder):
        self.kube = kube
        self.settings = settings
        self.recorder = recorder
        self._gang: tuple[float, GangApi | None] | None = None
        self._gang_lock = asyncio.Lock()

    async def ensure(self, mem: JobMemory, job: dict[str, Any], objects: list[dict[str, Any]], *,
                            world: bool = False) -> None:
        """Create what is missing (and update the config when the spec changed); say so if it was repaired.

        RoleBindings go last: without the ``bind`` verb (the chart's least-privilege account) the
        API server refuses a binding whose Role does not exist yet.
        """
        bindings = [o for o in objects if o["kind"] == "RoleBinding"]
        if bindings and len(bindings) < len(objects):
            await self.ensure(mem, job, [o for o in objects if o["kind"] != "RoleBinding"], world=world)
            objects, world = bindings, False
        todo = []
        for obj in objects:
            ident = (obj["kind"], obj["metadata"]["name"])
            if obj["kind"] == "ConfigMap" and CONFIG_KEY in obj["data"]:
                text = obj["data"][CONFIG_KEY]
                if ident in mem.ensured and text == mem.config_text:
                    continue
                todo.append(self._ensure_config(mem, obj, text))
            elif ident not in mem.ensured:
                todo.append(self._ensure_one(mem, obj))
        # The world ConfigMap appears with the first world (workers wait for it);
        # after that it is recreated if deleted.
        name = world_map_name(mem.key[1])
        if world and mem.world.version > 0 and (("World", name) in mem.lost or ("ConfigMap", name) not in mem.ensured):
            todo.append(self.write_world(mem, job, mem.world, create_only=True))
        if not todo:
            return
        results = await asyncio.gather(*todo, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        repaired = [r for r in results if isinstance(r, str)]
        if repaired:
            self.recorder.emit(job, "Warning", "Repaired", "Recreated " + ", ".join(repaired) + ": it was deleted")

    async def _ensure_one(self, mem: JobMemory, obj: dict[str, Any]) -> str | None:
        """Create if absent; returns the object's description if it had been seen deleted."""
        return (await self._create_owned(mem, obj))[1]

    async def _create_owned(self, mem: JobMemory, obj: dict[str, Any]) -> tuple[bool, str | None]:
        ident = (obj["kind"], obj["metadata"]["name"])
        created = await self.kube.create_if_absent(kind_of(obj).path(mem.key[0]), obj)
        mem.ensured.add(ident)
        was_lost = ident in mem.lost
        mem.lost.discard(ident)
        return created, (f"{obj['kind']} {obj['metadata']['name']}" if created and was_lost else None)

    async def _ensure_config(self, mem: JobMemory, obj: dict[str, Any], text: str) -> str | None:
        # Create first: for a new job that is the only call. Only an existing
        # config is read, and patched if the spec (so job.json) changed.
        created, repaired = await self._create_owned(mem, obj)
        path = CONFIG_MAP.path(mem.key[0], obj["metadata"]["name"])
        if not created and mem.config_text != text:
            current = await self.kube.get(path)
            if current is not None and (current.get("data") or {}).get(CONFIG_KEY) != text:
                await self.kube.patch(path, {"data": {CONFIG_KEY: text}})
        mem.config_text = text
        return repaired

    async def ensure_gang(self, mem: JobMemory, job: dict[str, Any], spec: TrainingJobSpec,
                           now: dt.datetime) -> dict[str, Any]:
        if not spec.scheduling.gang:
            return {}
        api = await self.gang_api()
        name = mem.key[1]
        message = gang_message(api, name, spec)
        cond = get_condition(mem.status.conditions, "GangScheduling")
        ok = api is not None
        reason = api.flavour.replace("-", " ").title().replace(" ", "") if api else "Unsupported"
        if cond is None or cond.reason != reason or cond.message != message:
            mem.status.conditions = set_condition(mem.status.conditions, "GangScheduling", ok, reason, message,
                                                  generation=int(job["metadata"].get("generation") or 0), now=now)
            self.recorder.emit(job, "Normal" if ok else "Warning",
                               "GangScheduling" if ok else "GangSchedulingUnsupported", message)
        if api is None:
            return {}
        if mem.gang_key != api.description:
            obj = build_gang_object(api, job, spec)
            if await self.kube.create_if_absent(api.kind.path(mem.key[0]), obj):
                self.recorder.emit(job, "Normal", "Created", f"Created {api.description} {name}")
            mem.gang_key = api.description
        return gang_pod_fields(api, name, spec)

    async def gang_api(self) -> GangApi | None:
        """The preferred gang scheduling API the server offers (discovery, cached)."""
        async with self._gang_lock:
            if self._gang and time.monotonic() < self._gang[0]:
                return self._gang[1]
            served: set[tuple[str, str]] = set()
            for found in await asyncio.gather(*(self.kube.served_resources(gv) for gv in DISCOVERY_GROUP_VERSIONS)):
                served |= found
            api = choose_gang_api(served)
            self._gang = (time.monotonic() + self.settings.discovery_s, api)
            return api

    async def write_world(self, mem: JobMemory, job: dict[str, Any], world: World, *,
                           create_only: bool = False) -> str | None:
        ns, name = mem.key
        body = build_world_map(job, world)
        path = CONFIG_MAP.path(ns, world_map_name(name))
        repaired: str | None = None
        if create_only:
            # Recreate what memory holds; a concurrent publish of a newer world wins (it patches).
            if await self.kube.create_if_absent(CONFIG_MAP.path(ns), body) and ("World", world_map_name(name)) in \
                    mem.lost and world.version > 0:
                repaired = f"ConfigMap {world_map_name(name)}"
        else:
            try:
                await self.kube.patch(path, {"data": body["data"]})
            except ApiError as e:
                if e.status != 404:
                    raise
                if not await self.kube.create_if_absent(CONFIG_MAP.path(ns), body):
                    await self.kube.patch(path, {"data": body["data"]})  # recreated meanwhile
            mem.world = world
        mem.ensured.add(("ConfigMap", world_map_name(name)))
        mem.lost.discard(("World", world_map_name(name)))
        mem.lost.discard(("ConfigMap", world_map_name(name)))
        return repaired
