"""Loopback IPs for pods: 127.0.0.10 upwards, unique among running process-node pods.

The whole 127.0.0.0/8 block reaches the loopback interface on Linux, so every
pod can bind its own address and the same ports (gloo, metrics) as its peers.
Leases live in one JSON file in the cluster dir, changed under an flock, so
several daemons on one cluster dir never hand out the same address. Allocation
goes round-robin: an address just released (whose sockets may linger in
TIME_WAIT, and which an old world ConfigMap may still name) is reused last, and
an address that any socket on the machine still uses (another cluster's pod,
say) is skipped.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FIRST = 10  # 127.0.0.1 is the host (and the API server); keep a few low addresses free
SPAN = 0xFFFF00  # up to 127.255.255.x


def index_to_ip(i: int) -> str:
    return f"127.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def process_id(pid: int | None = None) -> str:
    """pid plus its start time, so a recycled pid is not mistaken for a live owner."""
    pid = pid or os.getpid()
    try:
        with open(f"/proc/{pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        start = "?"
    return f"{pid}:{start}"


def addresses_in_use() -> set[str]:
    """IPv4 addresses that sockets on this machine are bound to (from /proc/net)."""
    out = set()
    for table in ("tcp", "udp"):
        try:
            with open(f"/proc/net/{table}") as f:
                next(f)
                for line in f:
                    hex_ip = line.split()[1].split(":")[0]
                    out.add(".".join(str(int(hex_ip[i:i + 2], 16)) for i in (6, 4, 2, 0)))
        except (OSError, StopIteration, ValueError):
            continue
    return out


def _owner_alive(owner: str) -> bool:
    pid = int(owner.split(":", 1)[0])
    return owner == process_id(pid) and os.path.exists(f"/proc/{pid}")


class Ipam:
    def __init__(self, state_dir: Path):
        self.path = state_dir / "ips.json"
        self.lock_path = state_dir / "ips.lock"
        state_dir.mkdir(parents=True, exist_ok=True)
        self.me = process_id()

    @contextmanager
    def _locked(self):
        with open(self.lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
            except ValueError:
                state = {}
            state.setdefault("next", FIRST)
            state.setdefault("leases", {})
            # Leases of daemons that are gone are free again.
            state["leases"] = {ip: v for ip, v in state["leases"].items() if _owner_alive(v["daemon"])}
            yield state
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
            os.replace(tmp, self.path)

    def allocate(self, uid: str, pod: str) -> str:
        with self._locked() as state:
            for ip, lease in state["leases"].items():
                if lease["uid"] == uid:
                    return ip
            busy = addresses_in_use()
            i = state["next"]
            for _ in range(SPAN):
                if i >= SPAN or (i & 255) in (0, 255):
                    i = FIRST if i >= SPAN else i + 1
                    continue
                ip = index_to_ip(i)
                i += 1
                if ip not in state["leases"] and ip not in busy:
                    state["leases"][ip] = {"uid": uid, "pod": pod, "daemon": self.me}
                    state["next"] = i
                    return ip
            raise RuntimeError("no free loopback address")

    def release(self, uid: str) -> None:
        with self._locked() as state:
            state["leases"] = {ip: v for ip, v in state["leases"].items() if v["uid"] != uid}

    def release_all_mine(self, keep: set[str]) -> None:
        """Drop this daemon's leases except those of the pod uids in keep."""
        with self._locked() as state:
            state["leases"] = {ip: v for ip, v in state["leases"].items()
                               if v["daemon"] != self.me or v["uid"] in keep}
