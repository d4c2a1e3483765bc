"""Import rules from DESIGN.md, checked on the source (lazy imports inside functions included).

- cohort.operator never imports torch or cohort.trainer;
- cohort.api (the models) imports neither kopf nor the Kubernetes client;
- cohort.client (the SDK and the `cohort` command) imports neither torch, kopf, the operator nor the trainer
  (it reaches the trainer's commands through importlib, only when one is run);
- cohort.trainer never imports kopf or cohort.operator;
- the planner core (cohort.trainer.planner) imports nothing but itself and the
  standard library: parallel/, profiling and calibrate use it, never the reverse;
- no module of either project imports, through any chain, a module that imports it
  (no import circles);
- `cohort plan` runs, and ranks plans, in an interpreter where torch cannot be imported.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
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
    ("api/src/cohort/api", ("kopf", "kubernetes", "torch", "cohort.operator", "cohort.trainer")),
    ("client/src/cohort/client", ("torch", "kopf", "cohort.operator", "cohort.trainer")),
    ("operator/src/cohort/operator", ("torch", "cohort.trainer")),
    ("trainer/src/cohort/trainer", ("kopf", "kubernetes", "cohort.operator")),
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


# --- the module graph: circles and directions -------------------------------------------

PROJECTS = [("api/src", "cohort.api"), ("operator/src", "cohort.operator"), ("trainer/src", "cohort.trainer")]


def module_files(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` under ``src``."""
    out = {}
    for path in sorted((src / package.replace(".", "/")).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the same project it imports (relative imports resolved; lazy ones too)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    graph[mod].add(name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("src, package", PROJECTS)
def test_no_import_circles(src, package):
    assert circles(import_graph(module_files(REPO / src, package))) == []


def test_the_planner_core_imports_only_itself_and_the_standard_library():
    mods = module_files(REPO / "trainer/src", "cohort.trainer")
    core = {m for m in mods if m == "cohort.trainer.planner" or m.startswith("cohort.trainer.planner.")}
    graph = import_graph(mods)
    outward = sorted(f"{m} imports {t}" for m in core for t in graph[m] if t not in core)
    assert outward == []
    third_party = sorted(f"{m} imports {name}" for m in core for name in imported_modules(mods[m])
                         if name.split(".")[0] not in sys.stdlib_module_names)
    assert third_party == []


def test_the_graph_finds_a_circle_through_a_lazy_relative_import(tmp_path):
    pkg = tmp_path / "p" / "q"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("from p.q.a import x\n")
    (pkg / "d.py").write_text("from .a import f\n")
    graph = import_graph(module_files(tmp_path, "p.q"))
    assert circles(graph) == [["p.q.a", "p.q.b", "p.q.c"]]


# --- `cohort plan` without torch --------------------------------------------------------

BLOCK_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} is blocked")

sys.meta_path.insert(0, NoTorch())
"""


def test_cohort_plan_ranks_plans_where_torch_cannot_be_imported():
    code = BLOCK_TORCH + textwrap.dedent(f"""
        from cohort.trainer.cli import main
        rc = main(["plan", {str(REPO / "examples/transformer-auto.yaml")!r}, "--gpus", "4"])
        assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch was imported"
        sys.exit(rc)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("api/src", "trainer/src"))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if "dp=" in line]
    assert len(rows) >= 3, proc.stdout  # every dp x tp x pp split of 4 devices, ranked
    assert "strategy: auto would run dp=" in proc.stdout, proc.stdout
