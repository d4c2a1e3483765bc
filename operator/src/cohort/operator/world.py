"""Membership: which pods are in world version N (docs/contracts.md §3).

The operator is the only authority on membership, and this module is where it
decides. :func:`next_world` is pure: the previous world plus the Ready pods in,
the next world out. The rules, in order:

- survivors keep their relative order, newcomers are appended (oldest pod
  first), so rank 0 is the longest-lived member and hosts the rendezvous store;
- the size is capped at ``replicas.target`` and rounded down to a multiple of
  ``tensor x pipeline`` (a model replica is indivisible);
- when the cap forces survivors out (scale-down), the newest leave first;
- a world smaller than ``replicas.min`` is not a world the job trains in, so it
  is published empty: the survivors wait until enough workers are Ready;
- every Ready pod that is not a member is a spare;
- the version grows only when the members change, or when they re-form after a false alarm
  (decide.membership, reports.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .naming import RDZV_PORT, pod_index


@dataclasses.dataclass(frozen=True)
class Member:
    """A worker pod as the world names it."""

    pod: str
    uid: str = ""
    ip: str = ""

    def to_json(self, rank: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {} if rank is None else {"rank": rank}
        out.update({"pod": self.pod, "uid": self.uid, "ip": self.ip})
        return out


@dataclasses.dataclass(frozen=True)
class World:
    """One published membership: the content of the ``<job>-world`` ConfigMap."""

    version: int = 0
    members: tuple[Member, ...] = ()
    spares: tuple[Member, ...] = ()
    reason: str = ""

    @property
    def names(self) -> list[str]:
        return [m.pod for m in self.members]

    @property
    def size(self) -> int:
        return len(self.members)

    def rank_of(self, pod: str) -> int:
        for rank, m in enumerate(self.members):
            if m.pod == pod:
                return rank
        return -1

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "members": [m.to_json(rank) for rank, m in enumerate(self.members)],
            "master": {"addr": self.members[0].ip, "port": RDZV_PORT} if self.members else None,
            "spares": [m.to_json() for m in self.spares],
            "plan": None,
            "reason": self.reason,
        }

    def render(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> World:
        def member(d: Mapping[str, Any]) -> Member:
            return Member(pod=str(d.get("pod", "")), uid=str(d.get("uid", "")), ip=str(d.get("ip", "")))

        members = sorted(data.get("members") or [], key=lambda d: int(d.get("rank", 0)))
        return cls(version=int(data.get("version", 0)), members=tuple(member(d) for d in members),
                   spares=tuple(member(d) for d in data.get("spares") or []), reason=str(data.get("reason", "")))

    @classmethod
    def parse(cls, text: str | None) -> World | None:
        """The world in a ConfigMap's ``world.json`` (None when absent or unreadable)."""
        if not text:
            return None
        try:
            return cls.from_json(json.loads(text))
        except (ValueError, TypeError, AttributeError):
            return None


def world_size(ready: int, *, target: int, unit: int, minimum: int) -> int:
    """How many ranks the world has with ``ready`` candidates (0 below min)."""
    unit = max(unit, 1)
    size = (min(ready, target) // unit) * unit
    return size if size >= minimum else 0


def next_world(prev: World, ready: Sequence[Member], *, target: int, unit: int, minimum: int,
               why: Mapping[str, str] | None = None, prefer: Sequence[str] = ()) -> World:
    """The next world from the previous one and the Ready, admissible pods.

    ``ready`` must already exclude pods that may not be members (terminating,
    failed, or being swapped out). ``why`` explains departures ("failed",
    "was deleted"...) for the world's ``reason``. Newcomers join oldest
    first, those in ``prefer`` before the others.
    """
    by_name = {m.pod: m for m in ready}
    # The fresh Member (IP, UID) from the pod, in the old rank order.
    survivors = [by_name[m.pod] for m in prev.members if m.pod in by_name]
    size = world_size(len(ready), target=target, unit=unit, minimum=minimum)
    if len(survivors) > size:
        newest_first = sorted(survivors, key=lambda m: pod_index(m.pod), reverse=True)
        leaving = {m.pod for m in newest_first[: len(survivors) - size]}
        members = [m for m in survivors if m.pod not in leaving]
    else:
        kept = {m.pod for m in survivors}
        newcomers = sorted((m for m in ready if m.pod not in kept), key=lambda m: (m.pod not in prefer, pod_index(m.pod)))
        members = survivors + newcomers[: size - len(survivors)]
    member_names = {m.pod for m in members}
    spares = tuple(sorted((m for m in ready if m.pod not in member_names), key=lambda m: pod_index(m.pod)))
    changed = [(m.pod, m.uid) for m in members] != [(m.pod, m.uid) for m in prev.members]
    if not changed:
        return dataclasses.replace(prev, members=tuple(members), spares=spares)
    reasons = dict(why or {})
    for m in survivors:  # Ready, yet out: the cap (scale-down) or too few to train
        reasons.setdefault(m.pod, "waits as a spare" if size else "waits")
    return World(version=prev.version + 1, members=tuple(members), spares=spares,
                 reason=describe_change(prev, members, reasons, size=size, minimum=minimum))


def describe_change(prev: World, members: Sequence[Member], why: Mapping[str, str], *,
                    size: int, minimum: int) -> str:
    """A one-line reason for a new version, e.g. "worker a-worker-1 failed; a-worker-4 joined"."""
    new_names = [m.pod for m in members]
    parts = [f"worker {p} {why.get(p, 'left')}" for p in prev.names if p not in new_names]
    joined = [p for p in new_names if p not in prev.names]
    if joined:
        parts.append(", ".join(joined) + (" joined" if prev.members else " formed the world"))
    if not members and minimum:
        parts.append(f"fewer than replicas.min={minimum} workers Ready; waiting")
    return "; ".join(parts) or f"world of {size}"
