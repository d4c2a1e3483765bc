"""Straggler detection: windows, reference rules, cooldown, metric parsing."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from cohort.operator.stragglers import (
    ComputeWindow,
    Sample,
    detect_straggler,
    find_straggler,
    parse_compute_sample,
    window_mean,
)


def feed(window: ComputeWindow, pod: str, step_s: float, *, start: float = 0, until: float = 60, every: float = 5):
    t, steps = start, 0.0
    while t <= until:
        window.add(pod, Sample(t=t, sum_s=steps * step_s, count=steps))
        steps += every / step_s if step_s else 0
        t += every


def test_window_mean_needs_a_full_window_and_enough_steps():
    series = [Sample(0, 0, 0), Sample(10, 1.0, 10), Sample(20, 2.0, 20)]
    assert window_mean(series, now=20, window_s=20) == 0.1
    assert window_mean(series, now=20, window_s=30) is None  # no sample that old
    assert window_mean([Sample(0, 0, 0), Sample(10, 0.2, 2)], now=10, window_s=10) is None  # < 3 steps


def test_median_rule_with_three_or_more_members():
    assert find_straggler({"a": 0.1, "b": 0.11, "c": 0.4}, 1.5).pod == "c"
    assert find_straggler({"a": 0.1, "b": 0.11, "c": 0.14}, 1.5) is None
    assert find_straggler({"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.4}, 1.5).pod == "d"


def test_two_members_compare_against_the_faster():
    s = find_straggler({"a": 0.1, "b": 0.2}, 1.5)
    assert s.pod == "b" and s.ratio == 2.0
    assert find_straggler({"a": 0.1, "b": 0.14}, 1.5) is None
    assert find_straggler({"a": 0.1}, 1.5) is None


def test_detect_over_a_window_with_cooldown():
    w = ComputeWindow()
    feed(w, "a", 0.1)
    feed(w, "b", 0.1)
    feed(w, "c", 0.5)
    verdict = detect_straggler(w, ["a", "b", "c"], now=60, window_s=30, threshold=1.5)
    assert verdict.pod == "c" and abs(verdict.mean_s - 0.5) < 1e-9
    assert detect_straggler(w, ["a", "b", "c"], now=60, window_s=30, threshold=1.5, cooldown_until=61) is None
    # A member without a full window blocks the verdict (a newcomer has not shown its speed).
    feed(w, "d", 0.1, start=50)
    assert detect_straggler(w, ["a", "b", "c", "d"], now=60, window_s=30, threshold=1.5) is None


def test_counter_reset_starts_a_new_series_and_retain_prunes():
    w = ComputeWindow()
    w.add("a", Sample(0, 5, 50))
    w.add("a", Sample(5, 0.1, 1))
    assert len(w.samples["a"]) == 1
    feed(w, "b", 0.1, until=100)
    w.retain(["b"], now=100, keep_s=20)
    assert "a" not in w.samples and w.samples["b"][0].t <= 80 and len(w.samples["b"]) <= 6


def test_parse_compute_sample_from_prometheus_text():
    text = """# HELP cohort_step_compute_seconds per-step compute
# TYPE cohort_step_compute_seconds histogram
cohort_step_compute_seconds_bucket{le="0.1"} 3.0
cohort_step_compute_seconds_bucket{le="+Inf"} 7.0
cohort_step_compute_seconds_sum 1.25
cohort_step_compute_seconds_count 7.0
# TYPE cohort_loss gauge
cohort_loss 0.3
"""
    s = parse_compute_sample(text_string_to_metric_families(text), t=3.0)
    assert s == Sample(t=3.0, sum_s=1.25, count=7.0)
    assert parse_compute_sample(text_string_to_metric_families("cohort_loss 1\n"), t=0) is None
