"""The built-in digits dataset reads scikit-learn's bundled file itself (workloads/datasets.py): it must
hold what ``sklearn.datasets.load_digits`` returns, bit for bit, and not import ``sklearn.datasets``."""

from __future__ import annotations

import subprocess
import sys

import torch

from cohort.trainer.workloads import datasets


def test_digits_equal_scikit_learns_load_digits():
    from sklearn.datasets import load_digits

    pixels, labels = datasets.load_digits()
    d = load_digits()
    assert pixels.shape == (1797, 64) and labels.shape == (1797,)
    assert torch.equal(pixels, torch.tensor(d.data, dtype=torch.float64))
    assert torch.equal(labels, torch.tensor(d.target, dtype=torch.long))


def test_the_digits_workload_does_not_import_sklearn_datasets():
    code = ("import sys; from cohort.trainer.workloads.datasets import digits; data = digits(); "
            "print(len(data.train), len(data.eval), 'sklearn.datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1438", "359", "False"], out.stdout
