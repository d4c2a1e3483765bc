"""Helpers for tests that run real trainer processes through `cohort run --local`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]


def manifest(name: str = "t", **spec: Any) -> dict[str, Any]:
    base = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    base["metadata"]["name"] = name
    for section, values in spec.items():
        if isinstance(values, dict):
            base["spec"].setdefault(section, {}).update(values)
        else:
            base["spec"][section] = values
    return base


def write_manifest(path: Path, m: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(m))
    return path


def cohort(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The ``cohort`` command to its end. Past ``timeout`` it gets SIGTERM, on which ``cohort run --local``
    stops its workers (cli.py) before TimeoutExpired is raised: subprocess.run's SIGKILL would leave them
    running, in sessions of their own, to load the machine for the tests after."""
    proc = subprocess.Popen([sys.executable, "-m", "cohort.trainer.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_local(tmp: Path, m: dict[str, Any], workers: int, env: dict[str, str] | None = None,
              ckpt: Path | None = None, timeout: float = 300, extra: Sequence[str] = ()) -> dict[str, Any]:
    """Run a manifest to completion; return the summary (fails the test with the logs otherwise)."""
    mf = write_manifest(tmp / f"{m['metadata']['name']}.yaml", m)
    summary = tmp / "summary.json"
    args = ["run", str(mf), "--local", "--workers", str(workers), "--run-dir", str(tmp / "run"),
            "--summary-json", str(summary)]
    if ckpt is not None:
        args += ["--checkpoint-dir", str(ckpt)]
    proc = cohort(*args, *extra, env=env, timeout=timeout)
    assert proc.returncode == 0, f"cohort run failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(summary.read_text())


def start_local(tmp: Path, m: dict[str, Any], workers: int, ckpt: Path, extra: Sequence[str] = (),
                env: dict[str, str] | None = None) -> subprocess.Popen:
    mf = write_manifest(tmp / f"{m['metadata']['name']}.yaml", m)
    return subprocess.Popen([sys.executable, "-m", "cohort.trainer.cli", "run", str(mf), "--local", "--workers",
                             str(workers), "--run-dir", str(tmp / "run"), "--checkpoint-dir", str(ckpt), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, **(env or {})})


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every worker it started (each worker has its own session)."""
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True)
    for pid in [int(p) for p in children.stdout.split()] + [proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    proc.wait()


def wait_for_file(path: Path, timeout_s: float = 120) -> None:
    wait_for(path.exists, timeout_s, 0.02, what=f"{path} to appear")


def final_model(ckpt_root: Path, step: int | None = None) -> dict[str, torch.Tensor]:
    """The model tensors of the newest committed checkpoint under ``ckpt_root`` (or of the one at ``step``)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    steps = sorted(p for p in ckpt_root.iterdir() if (p / "COMMITTED").exists())
    chosen = steps[-1] if step is None else ckpt_root / f"step-{step:08d}"
    out = ckpt_root / f"{chosen.name}.pt"
    dcp_to_torch_save(str(chosen), str(out))
    return torch.load(out, weights_only=False)["model"]
