"""Import rules from DESIGN.md, checked on the source (lazy imports inside functions included).

- cohort.operator never imports torch or cohort.trainer;
- cohort.operator.api (the models) imports neither kopf nor the Kubernetes client;
- cohort.trainer never imports kopf or cohort.operator.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def violations(root: Path, banned: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        for mod in imported_modules(path):
            if any(mod == b or mod.startswith(b + ".") for b in banned):
                bad.append(f"{path.relative_to(REPO)} imports {mod}")
    return bad


@pytest.mark.parametrize("root, banned", [
    ("operator/src/cohort/operator", ("torch", "cohort.trainer")),
    ("operator/src/cohort/operator/api", ("kopf", "kubernetes", "torch", "cohort.trainer")),
    ("trainer/src/cohort/trainer", ("kopf", "cohort.operator")),
])
def test_import_rules(root, banned):
    assert violations(REPO / root, banned) == []


def test_the_rule_detects_a_violation(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    import torch.nn as nn\n    from cohort.trainer import x\n")
    global REPO
    old, REPO = REPO, tmp_path
    try:
        assert len(violations(tmp_path, ("torch", "cohort.trainer"))) == 2
    finally:
        REPO = old
