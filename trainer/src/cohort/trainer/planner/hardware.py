"""Hardware: the machine numbers the cost model needs, where they come from, and their units.

They come from ``cohort calibrate`` (a JSON file, by default
``~/.cache/cohort/calibration.json``), from ``cohort plan`` flags, or from the
defaults below (this kind of machine: CPU ranks on one host talking gloo over
loopback, as measured by the calibration on the development machines).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from .collectives import allgather_time, allreduce_time, p2p_time

DEFAULT_CALIBRATION = Path(os.path.expanduser("~/.cache/cohort/calibration.json"))


@dataclass(frozen=True)
class Hardware:
    """Per-device and per-link numbers; all SI units (seconds, bytes, FLOP/s)."""

    alpha_s: float = 3e-4
    """Latency of one message (α), seconds."""
    beta_s_per_byte: float = 1.5e-9
    """Time per byte on a link (β = 1 / bandwidth), seconds per byte."""
    allreduce: str = "ring"
    """Which allreduce model (collectives.ALLREDUCE_MODELS) the backend follows."""
    lines: tuple[tuple[str, int, float, float], ...] = ()
    """Measured ``(collective, P, a_s, b_s_per_byte)``: t = a + b·m for ``allreduce``, ``allgather`` and
    ``reduce_scatter`` (m: the full tensor's bytes) among P ranks; used instead of the α-β model for those P.
    On a shared host they are taken with every rank busy (the job's subgroups run side by side)."""
    sync_lines: tuple[tuple[int, float], ...] = ()
    """Measured ``(P, seconds)``: what one collective or send among P ranks adds on top of its line when the
    ranks compute between collectives (shared cores: waiting for a descheduled peer)."""
    block_table: tuple[tuple[float, float], ...] = ()
    """Measured ``(FLOPs, seconds)`` of a transformer block's forward + backward calls of growing size;
    block compute is interpolated from it (small calls run far below peak), else FLOPs / device_flops."""
    device_flops: float = 8e10
    """FLOP/s one rank reaches on training-sized matmuls when it runs alone."""
    host_flops: float = 0.0
    """FLOP/s all ranks together reach (0: devices do not share compute, as GPUs do not). Set when the
    ranks share one host's cores: a step then cannot beat the host's total work / host_flops."""
    layer_overhead_s: float = 3e-4
    """Fixed cost of one block's forward + backward (eager dispatch, no FLOPs), per microbatch."""
    tp_layer_overhead_s: float = 2e-3
    """The same under DTensor tensor parallelism (DTensor dispatch and redistribution bookkeeping)."""
    fsdp_unit_overhead_s: float = 5e-4
    """Fixed cost of one FSDP unit per step (hooks, copy-in/out), besides its collectives."""
    microbatch_overhead_s: float = 1e-4
    """Fixed cost of one microbatch in a pipeline schedule (stage bookkeeping, chunking)."""
    memory_bytes: float = 0.0
    """Memory per device, bytes (0: unlimited)."""
    memory_bandwidth: float = 5e9
    """Bytes/s one rank streams through memory (optimizer update)."""
    source: str = "defaults"
    """Where these numbers came from (a file, flags)."""

    def _line(self, p: int, op: str = "allreduce") -> tuple[float, float] | None:
        return next(((a, b) for o, q, a, b in self.lines if q == p and o == op), None)

    def block_s(self, flops: float) -> float:
        """Seconds of a block forward + backward doing ``flops`` (fixed costs included)."""
        table = sorted(self.block_table)
        if not table:
            return flops / self.device_flops + self.layer_overhead_s
        if flops <= table[0][0]:  # below the table: the fixed cost dominates; scale the smallest call's time
            f0, t0 = table[0]
            return t0 * (0.5 + 0.5 * flops / f0)
        if flops >= table[-1][0]:  # above it: the largest call's throughput
            f1, t1 = table[-1]
            return flops * t1 / f1
        for (f0, t0), (f1, t1) in zip(table, table[1:], strict=False):
            if f0 <= flops <= f1:  # log-log interpolation between measured calls
                w = math.log(flops / f0) / math.log(f1 / f0)
                return math.exp(math.log(t0) + w * math.log(t1 / t0))
        raise AssertionError("unreachable")

    @property
    def cores(self) -> float:
        """How many ranks' worth of compute a shared host has (inf when devices do not share)."""
        return self.host_flops / self.device_flops if self.host_flops > 0 else float("inf")

    def sync_s(self, p: int) -> float:
        return next((s for q, s in self.sync_lines if q == p), 0.0) if p > 1 else 0.0

    def allreduce_s(self, nbytes: float, p: int) -> float:
        line = self._line(p)
        if p <= 1 or nbytes <= 0:
            return 0.0
        if line:
            return line[0] + line[1] * nbytes + self.sync_s(p)
        return allreduce_time(nbytes, p, self.alpha_s, self.beta_s_per_byte, self.allreduce)

    def allgather_s(self, nbytes: float, p: int, op: str = "allgather") -> float:
        """Allgather with an ``nbytes`` result (or reduce-scatter of ``nbytes``); the model: half a ring allreduce."""
        if p <= 1 or nbytes <= 0:
            return 0.0
        line = self._line(p, op)
        if line:
            return line[0] + line[1] * nbytes + self.sync_s(p)
        line = self._line(p)
        if line:
            return (line[0] + line[1] * nbytes) / 2 + self.sync_s(p)
        return allgather_time(nbytes, p, self.alpha_s, self.beta_s_per_byte)

    def reduce_scatter_s(self, nbytes: float, p: int) -> float:
        return self.allgather_s(nbytes, p, op="reduce_scatter")

    def p2p_s(self, nbytes: float) -> float:
        line = self._line(2)  # a 2-rank ring allreduce is two latencies and one message's bytes
        if nbytes <= 0:
            return 0.0
        if line:
            return line[0] / 2 + line[1] * nbytes + self.sync_s(2)
        return p2p_time(nbytes, self.alpha_s, self.beta_s_per_byte)

    def with_overrides(self, **changes: Any) -> Hardware:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def load_hardware(path: str | os.PathLike[str] | None = None) -> Hardware:
    """Hardware from a calibration file (the default one if it exists), else the defaults."""
    p = Path(path) if path else DEFAULT_CALIBRATION
    if not p.exists():
        if path:
            raise FileNotFoundError(f"--calibration {p}: no such file (create it with `cohort calibrate --out {p}`)")
        return Hardware()
    doc = json.loads(p.read_text())
    known = {f.name for f in fields(Hardware)}
    values = {k: v for k, v in doc.get("hardware", doc).items() if k in known}
    for key in ("lines", "sync_lines", "block_table"):
        values[key] = tuple(tuple(x) for x in values.get(key, ()))
    return Hardware(**values).with_overrides(source=str(p))


def save_hardware(hw: Hardware, path: str | os.PathLike[str], extra: dict[str, Any] | None = None) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"hardware": asdict(hw), **(extra or {})}, indent=1))
    return p


_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15,
          "ki": 2 ** 10, "mi": 2 ** 20, "gi": 2 ** 30, "ti": 2 ** 40}


def _scaled(text: str, suffixes: tuple[str, ...], what: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?)\s*([kmgtp]i?)?(" + "|".join(suffixes) + r")?\s*", text, re.I)
    if not m:
        raise ValueError(f"{what}: cannot read {text!r} (e.g. 80GiB, 100Gbit, 312TFLOPs, 10us)")
    return float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


def parse_bytes(text: str) -> float:
    """'80GiB' -> bytes (binary prefixes: Ki, Mi, Gi; decimal: k, M, G)."""
    return _scaled(text, ("b", "bytes", "B"), "memory")


def parse_bandwidth(text: str) -> float:
    """'100Gbit' or '100Gbps' (bits per second), or '12.5GB' (bytes per second) -> bytes per second."""
    m = re.fullmatch(r"(.*?)(bit|bps|b/s|bit/s)\s*", text.strip())
    if m:
        return _scaled(m.group(1), (), "bandwidth") / 8
    return _scaled(text, ("B", "B/s", "Bps"), "bandwidth")


def parse_flops(text: str) -> float:
    """'312TFLOPs' -> FLOP/s."""
    return _scaled(text, ("flops", "flop/s", "FLOPs", "FLOP/s"), "device throughput")


def parse_seconds(text: str) -> float:
    """'10us', '0.3ms', '2e-6s' -> seconds."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?)\s*(ns|us|µs|ms|s)?\s*", text)
    if not m:
        raise ValueError(f"latency: cannot read {text!r} (e.g. 10us)")
    return float(m.group(1)) * {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}[m.group(2)]
