"""The planner's ranked table, with a reason for each row's place."""

from __future__ import annotations

from .search import Candidate

_WHAT = {
    "compute": "compute",
    "bubble": "pipeline bubble",
    "tp": "tensor-parallel all-reduces",
    "pp": "pipeline sends",
    "dp": "gradient/parameter sync",
    "optimizer": "optimizer update",
}


def explain(c: Candidate, best: Candidate | None) -> str:
    """Why ``c`` ranks where it does, relative to the best plan."""
    if c.rejected:
        return "rejected: " + c.rejected
    parts = c.time.parts()
    if best is None or best is c:
        top = max(parts, key=lambda k: parts[k])
        return f"fastest; {_WHAT[top]} is {parts[top] / c.time.total:.0%} of its step"
    base = best.time.parts()
    deltas = {k: parts[k] - base[k] for k in parts}
    worst = max(deltas, key=lambda k: deltas[k])
    extra = c.time.total - best.time.total
    why = f"+{extra * 1e3:.1f} ms vs #1, mostly {_WHAT[worst]} (+{deltas[worst] * 1e3:.1f} ms)"
    if worst == "bubble":
        p, m = c.dims.pp, c.dims.microbatches
        why += f": idle {p - 1}/{m + p - 1} of the slots"
    saved = min(deltas, key=lambda k: deltas[k])
    if deltas[saved] < 0:
        why += f"; saves {-deltas[saved] * 1e3:.1f} ms of {_WHAT[saved]}"
    return why


def format_table(candidates: list[Candidate], limit: int | None = None) -> str:
    """A fixed-width table: rank, plan, predicted step time by part, memory per device, and why."""
    best = next((c for c in candidates if not c.rejected), None)
    rows = candidates if limit is None else candidates[:limit]
    w = max([28, *(len(c.dims.describe()) for c in rows)])  # the plan column fits its longest plan
    header = (f"{'#':>3}  {'plan':<{w}} {'step ms':>8} {'compute':>8} {'bubble':>7} {'tp':>7} {'pp':>6} "
              f"{'dp':>7} {'optim':>6} {'mem/dev':>10}  why")
    lines = [header, "-" * len(header)]
    for i, c in enumerate(rows, 1):
        t = c.time
        rank = "-" if c.rejected else str(i)
        lines.append(
            f"{rank:>3}  {c.dims.describe():<{w}} {t.total * 1e3:8.1f} {t.compute * 1e3:8.1f} {t.bubble * 1e3:7.1f} "
            f"{t.tp * 1e3:7.1f} {t.pp * 1e3:6.1f} {t.dp * 1e3:7.1f} {t.optimizer * 1e3:6.1f} "
            f"{_size(c.memory.total):>10}  {explain(c, best)}")
    if limit is not None and len(candidates) > limit:
        lines.append(f"     ... {len(candidates) - limit} more")
    return "\n".join(lines)


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"
