"""Progress as one line of text: what ``cohort submit --watch`` and ``cohort status`` print.

Pure functions of a :class:`~cohort.client.job.TrainingJob`, so the format is
tested without a cluster. Unknown values (no percent before the first step,
no ETA before the throughput is known) print as ``-``.
"""

from __future__ import annotations

import dataclasses

from cohort.api.models import Progress

from .job import TrainingJob

BAR_WIDTH = 20


def format_duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``42s``; ``-`` when unknown."""
    if seconds is None or seconds < 0:
        return "-"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def format_rate(value: float | None) -> str:
    """``12.3k``, ``950``, ``1.20M``; ``-`` when unknown."""
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e4:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def progress_bar(percent: float | None, width: int = BAR_WIDTH) -> str:
    if percent is None:
        return "[" + " " * width + "]"
    filled = max(0, min(width, int(percent / 100 * width)))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def format_progress(job: TrainingJob) -> str:
    """One line: name, phase, bar, percent, step, ETA, loss, throughput, world size, recoveries."""
    p, st = job.progress, job.status
    pct = "-" if p.percent is None else f"{p.percent:.1f}%"
    loss = "-" if p.loss is None else f"{p.loss:.4g}"
    return (f"{job.name} {job.phase:<10} {progress_bar(p.percent)} {pct:>6}  step {p.step}  "
            f"ETA {format_duration(p.eta_seconds)}  loss {loss}  {format_throughput(p)}  "
            f"world {st.world.size} (v{st.world.version})  recoveries {job.recoveries}")


def format_throughput(p: Progress) -> str:
    """``15.0k tok/s`` for a model whose samples are sequences of tokens, else ``950 samples/s``: the trainer
    reports a non-language model's samples as its tokens (``tokensPerSecond``, one token a sample)."""
    tokens, samples = p.tokens_per_second, p.samples_per_second
    if tokens is not None and (samples is None or tokens >= 1.5 * samples):
        return f"{format_rate(tokens)} tok/s"
    return f"{format_rate(samples if samples is not None else tokens)} samples/s"


def format_goodput(job: TrainingJob) -> str | None:
    """``12.8% of 14.9s: starting 11.1s, training 1.9s, ...``: ``status.goodput``, its parts largest first
    (docs/monitoring.md, "Goodput"); None before any second is accounted."""
    g = job.status.goodput
    if not g.wall_seconds:
        return None
    parts = sorted(((name, v) for name, v in dataclasses.asdict(g.seconds).items() if v > 0),
                   key=lambda kv: -kv[1])
    pct = "-" if g.percent is None else f"{g.percent:.1f}%"
    return f"{pct} of {_seconds(g.wall_seconds)}: " + ", ".join(
        f"{_camel(name)} {_seconds(v)}" for name, v in parts)


def _seconds(s: float) -> str:
    return f"{s:.1f}s" if s < 60 else format_duration(s)


def _camel(name: str) -> str:  # the status field's name, as in kubectl get -o yaml
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)
