"""Cohort's byte count (``cohort_bytes_sent_total``) against the kernel's.

The ranks run in a network namespace of their own (``unshare --net``), so its
loopback carries nothing but their traffic; the kernel's count includes every
TCP/IP header, ACK and gloo header. ``wire_probe.py`` first measures, with bare
collectives and point-to-point messages of four sizes, the fixed bytes per call
that each kind costs beyond its payload formula (about 4.1 KB for a ring
allreduce, 2.1 KB for an allgather and 1.1 KB for an all-to-all, per rank at
P = 4). Then, for each
pair, the kernel's count must equal Cohort's count plus those fixed costs for the
calls the pair made, within ``TOLERANCE`` of Cohort's count. A formula that
forgets a collective or counts a payload twice leaves that band (PowerSGD's
uncompressed allreduce alone is 19 % of its count).

Local SGD is covered with its averaging every 2 steps. Its calls looked
uncounted at first (9 allreduce calls against 3 averaging rounds): after its
warm-up, torch's ``post_localSGD_hook`` still calls allreduce on every bucket,
on a subgroup of one rank, which sends nothing. The probe now counts only calls
on groups of more than one rank.

Gossip is covered through its point-to-point messages (``isend``), dense and
quantized, including the metadata allgather and the dummy messages with which it
settles its links; gossip's ranks need not send equally often, so the calls are
the mean over ranks, as both counts are.

Not covered: dense allreduce (DDP's C++ reducer makes its calls, which the probe
cannot count). It is held to the kernel's count in bench/comm.py's bytes table
(docs/benchmarks.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from wire_probe import PAIRS

pytestmark = [pytest.mark.dist]

HERE = Path(__file__).resolve().parent
TOLERANCE = 0.03  # measured (6 runs, 3 of them beside 2 busy cores): within 0.8 %, except the sparse
# collective at -2.0 to -3.1 % while the fixed cost per call was the mean of 4 and 64 KB calls (a 64 KB
# all-to-all costs about 250 B more per call than the sparse collective's small ones); with the median
# over 64 B to 64 KB (wire_probe.SIZES) every pair is within 0.25 % (3 runs, quiet machine)


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("wire") / "counts.json"
    proc = subprocess.run(["unshare", "--net", sys.executable, str(HERE / "wire_probe.py"), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_fixed_cost_per_call_is_small_and_positive(probe):
    per_call = probe["per_call"]
    for kind in ("all_reduce", "all_gather_into_tensor", "all_to_all_single", "broadcast", "isend"):
        assert 0 < per_call[kind] < 20_000, per_call


@pytest.mark.parametrize("pair", [f"{s}:{m}:{c}" for s, m, c in PAIRS])
def test_cohorts_count_plus_the_fixed_cost_per_call_is_the_kernels_count(probe, pair):
    row, per_call = probe["pairs"][pair], probe["per_call"]
    expected = row["cohort"] + sum(n * per_call[kind] for kind, n in row["calls"].items() if kind != "barrier")
    assert row["cohort"] > 0 and sum(row["calls"].values()) > 0, row
    assert abs(row["kernel"] - expected) <= TOLERANCE * row["cohort"], (pair, row, expected)
