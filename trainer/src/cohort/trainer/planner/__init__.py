"""The auto-parallel planner's core: cost models, memory model, plan search (docs/parallelism.md#planner).

Pure Python, no torch: ``cohort plan`` runs where torch is not installed
(tests/contract/test_import_rules.py proves it). What needs torch is outside:
``cohort.trainer.profiling`` (a model's profile, measured), ``cohort.trainer.calibrate``
(``cohort calibrate``), and ``parallel/auto.py`` (``strategy: auto``, which runs the plan).

Entry points: ``rank_plans``/``best_plan`` and ``format_table`` (what ``cohort plan``
prints and ``strategy: auto`` chooses from), ``load_hardware``.
"""

from __future__ import annotations

from .dims import ParallelDims
from .hardware import Hardware, load_hardware
from .profile import ModelProfile, transformer_profile
from .report import format_table
from .search import Candidate, best_plan, rank_plans

__all__ = ["Candidate", "Hardware", "ModelProfile", "ParallelDims", "best_plan", "format_table", "load_hardware",
           "rank_plans", "transformer_profile"]
