"""Tokens per second and MFU (throughput.py): the FLOP count of the built-in transformer, and no MFU without a peak."""

from __future__ import annotations

import torch

from cohort.api.jobconfig import from_manifest
from cohort.trainer.throughput import Throughput, peak_flops
from cohort.trainer.workloads.workload import build_workload


def workload(model: str, dataset: str, **args):
    spec = from_manifest({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "t"},
                          "spec": {"workload": {"model": model, "dataset": dataset, **args}}}).spec
    return build_workload(spec)


def test_transformer_flops_are_6n_plus_attention_per_token():
    w = workload("transformer", "synthetic-lm", modelArgs={"dim": 64, "n_layers": 2, "n_heads": 4},
                 datasetArgs={"sequences": 8, "seq_len": 32, "vocab": 100})
    m = w.model
    n = sum(p.numel() for p in m.parameters()) - m.tok_embeddings.weight.numel() - m.pos_embeddings.weight.numel()
    t = Throughput.of(w, torch.device("cpu"), "bf16")
    assert t.tokens_per_sample == 32
    assert t.flops_per_sample == 32 * (6 * n + 12 * 2 * 64 * 32)
    assert t.tokens_per_second(10.0) == 320.0


def test_mfu_needs_a_known_peak(monkeypatch):
    w = workload("mlp", "digits")
    monkeypatch.delenv("COHORT_PEAK_TFLOPS", raising=False)
    t = Throughput.of(w, torch.device("cpu"), "fp32")
    assert t.tokens_per_sample == 1 and t.mfu(1000.0, 2) is None  # the CPU has no peak in the table
    monkeypatch.setenv("COHORT_PEAK_TFLOPS", "1")
    t = Throughput.of(w, torch.device("cpu"), "fp32")
    params = sum(p.numel() for p in w.model.parameters())
    assert t.mfu(1000.0, 2) == 1000.0 * 6 * params / (2 * 1e12)


def test_known_cards_use_their_dense_peak_for_the_precision(monkeypatch):
    import cohort.trainer.throughput as tp

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(tp, "device_name", lambda d: "NVIDIA H200")
    assert peak_flops(cuda, "bf16", {}) == 989e12 and peak_flops(cuda, "fp32", {}) == 494.5e12
    monkeypatch.setattr(tp, "device_name", lambda d: "Some Future GPU")
    assert peak_flops(cuda, "bf16", {}) is None
