"""A user's own package, outside the repository, through the entry points (marker dist).

The package is examples/user-package/cohort_user_example (docs/workloads.md),
copied to a temporary directory so that nothing resolves through the
repository, and put on the workers' PYTHONPATH as a user image would.
"""

from __future__ import annotations

import os
import shutil

import pytest
import yaml
from tests.support.local import REPO, run_local

pytestmark = [pytest.mark.dist]


@pytest.fixture
def user_pythonpath(tmp_path):
    pkg = tmp_path / "site"
    shutil.copytree(REPO / "examples/user-package/cohort_user_example", pkg / "cohort_user_example")
    return {"PYTHONPATH": os.pathsep.join([str(pkg), os.environ.get("PYTHONPATH", "")])}


def example(name: str, **workload) -> dict:
    m = yaml.safe_load((REPO / "examples/user-package" / name).read_text())
    m["spec"]["workload"].update(workload)
    return m


def test_a_users_dataset_of_files_and_model_train_through_the_entry_points(tmp_path, user_pythonpath):
    text = tmp_path / "text"
    text.mkdir()
    for i, f in enumerate(sorted((REPO / "docs").glob("*.md"))):  # real text files on "a volume"
        shutil.copy(f, text / f"{i:02d}.txt")
    m = example("text-files.yaml", datasetArgs={"root": str(text), "pattern": "*.txt", "seq_len": 64},
                epochs=0, maxSteps=60)
    s = run_local(tmp_path / "run", m, workers=2, env=user_pythonpath)
    assert s["step"] == 60, s
    assert s["perplexity"] < 40, s  # bytes: 256-way uniform is 256; a model that learned nothing stays near it


def test_hugging_face_gpt2_from_a_config_trains_through_the_model_entry_point(tmp_path, user_pythonpath):
    m = example("gpt2-text.yaml", maxSteps=30, datasetArgs={"seq_len": 32, "vocab_size": 512})
    s = run_local(tmp_path / "run", m, workers=2, env={**user_pythonpath, "COHORT_DATA_DIR": str(tmp_path / "d")})
    assert s["step"] == 30, s
    assert s["perplexity"] < 512 / 2, s  # learned something: a uniform guess over 512 tokens is 512
