"""The user entry-point contract (docs/workloads.md, "The entry-point contract"), issue 32 item 4.

Contract 2 is ``Data(train, eval, info, task)``; contract 1's
``Data(train_x, train_y, eval_x, eval_y, info, task)`` keeps working for a
release with a DeprecationWarning. An entry point that cannot be called as the
contract says, or returns the wrong type, fails the worker with exit code 2 and
a message naming the field and the expected type.
"""

from __future__ import annotations

import json
import sys
import textwrap
import warnings

import pytest
import torch
from tests.support.local import cohort, manifest, run_local, write_manifest

from cohort.api.jobconfig import load_manifest
from cohort.api.models import TrainingJobSpec
from cohort.api.schema import parse
from cohort.trainer.runtime.ports import free_port
from cohort.trainer.workloads import CONTRACT_1_REMOVED_IN, ENTRY_POINT_CONTRACT
from cohort.trainer.workloads.data import Data
from cohort.trainer.workloads.datasets import Data as DataWhereContract1HadIt
from cohort.trainer.workloads.splits import TensorPairs
from cohort.trainer.workloads.workload import WorkloadError, build_workload

PACKAGE = textwrap.dedent('''
    import torch
    from torch import nn
    from cohort.trainer.workloads.data import Data
    from cohort.trainer.workloads.models import DataInfo

    X, Y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    INFO = DataInfo((4,), num_classes=2)

    def contract_1():  # what a package written for contract 1 does
        return Data(X[:48], Y[:48], X[48:], Y[48:], INFO, "classification")

    def contract_1_keywords():
        return Data(train_x=X[:48], train_y=Y[:48], eval_x=X[48:], eval_y=Y[48:], info=INFO, task="classification")

    def contract_2():
        return Data((X[:48], Y[:48]), (X[48:], Y[48:]), INFO, "classification")

    def a_dict():
        return {"train": (X, Y)}

    def info_a_dict():
        return Data((X, Y), (X, Y), {"input_shape": (4,)}, "classification")

    def task_regression():
        return Data((X, Y), (X, Y), INFO, "regression")

    def seven_arguments():
        return Data(X, Y, X, Y, INFO, "classification", "extra")

    def model(info, hidden=8):
        return nn.Sequential(nn.Linear(info.input_shape[0], hidden), nn.ReLU(), nn.Linear(hidden, info.num_classes))

    class EvalModeChecked(nn.Module):
        """Refuses a forward without autograd (an evaluation) in training mode, which dropout and batch norm
        would silently get wrong."""

        def __init__(self, info):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(info.input_shape[0], 8), nn.Dropout(0.1), nn.ReLU(),
                                     nn.Linear(8, info.num_classes))

        def forward(self, x):
            if self.training and not torch.is_grad_enabled():
                raise AssertionError("evaluated in training mode")
            return self.net(x)

    def model_a_string(info):
        return "a model"

    def model_without_info():
        return nn.Linear(4, 2)
''')


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "user_pkg.py").write_text(PACKAGE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    sys.modules.pop("user_pkg", None)
    yield str(tmp_path / "site")
    sys.modules.pop("user_pkg", None)


def spec(dataset: str = "user_pkg:contract_2", model: str = "user_pkg:model") -> TrainingJobSpec:
    return parse(TrainingJobSpec, {"workload": {"model": model, "dataset": dataset, "maxSteps": 5}})


def test_the_contract_is_versioned():
    assert ENTRY_POINT_CONTRACT == 2 and CONTRACT_1_REMOVED_IN
    assert DataWhereContract1HadIt is Data  # contract 1's import path still names the one Data


def test_contract_1s_data_keeps_working_with_a_deprecation_warning(user_package, caplog):
    for entry in ("user_pkg:contract_1", "user_pkg:contract_1_keywords"):
        with pytest.warns(DeprecationWarning, match=rf"contract 1, deprecated and removed in cohort "
                                                     rf"{CONTRACT_1_REMOVED_IN}: write Data\(train, eval, info, task\)"):
            w = build_workload(spec(entry))
        assert isinstance(w.data.train, TensorPairs) and len(w.data.train) == 48 and len(w.data.eval) == 16
        assert w.task == "classification" and isinstance(w.model, torch.nn.Module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # contract 2 warns about nothing
        build_workload(spec("user_pkg:contract_2"))


@pytest.mark.parametrize("entry,field,needles", [
    ("user_pkg:a_dict", "spec.workload.dataset", ["returned a dict", "expected a cohort.trainer.workloads.data.Data",
                                                  "entry-point contract 2"]),
    ("user_pkg:info_a_dict", "spec.workload.dataset", ["Data.info is a dict", "expected a", "DataInfo"]),
    ("user_pkg:task_regression", "spec.workload.dataset", ["Data.task is 'regression'", "classification, lm"]),
    ("user_pkg:seven_arguments", "spec.workload.dataset", ["Data takes (train, eval, info, task)",
                                                           "entry-point contract 2"]),
])
def test_a_dataset_entry_point_breaking_the_contract_is_named(user_package, entry, field, needles):
    with pytest.raises(WorkloadError) as err:
        build_workload(spec(entry))
    message = str(err.value)
    assert message.startswith(f"{field}: ") and message.count(field) == 1, message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("entry,needles", [
    ("user_pkg:model_a_string", ["returned a str", "expected a torch.nn.Module or a "
                                 "cohort.trainer.workloads.workload.Workload"]),
    ("user_pkg:model_without_info", ["cannot be called as f(info, **modelArgs)", "entry-point contract 2"]),
])
def test_a_model_entry_point_breaking_the_contract_is_named(user_package, entry, needles):
    with pytest.raises(WorkloadError) as err:
        build_workload(spec(model=entry))
    message = str(err.value)
    assert message.startswith("spec.workload.model: "), message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("workload,needle", [
    ({"dataset": "user_pkg:a_dict"}, "spec.workload.dataset: user_pkg:a_dict returned a dict, expected a "
                                     "cohort.trainer.workloads.data.Data"),
    ({"model": "user_pkg:model_a_string"}, "spec.workload.model: user_pkg:model_a_string returned a str, expected a "
                                           "torch.nn.Module"),
    # Before: the model factory met a dict where DataInfo goes, and the worker died with a traceback (exit 1).
    ({"dataset": "user_pkg:info_a_dict"}, "spec.workload.dataset: Data.info is a dict, expected a "
                                          "cohort.trainer.workloads.models.DataInfo"),
])
def test_cohort_train_exits_2_naming_the_field_and_the_expected_type(tmp_path, user_package, workload, needle):
    m = manifest("entry", workload={"model": "user_pkg:model", "dataset": "user_pkg:contract_2", "modelArgs": {},
                                    **workload})
    (tmp_path / "job.json").write_text(json.dumps(load_manifest(write_manifest(tmp_path / "m.yaml", m)).to_document()))
    proc = cohort("train", "--config", str(tmp_path / "job.json"), timeout=120,
                  env={"PYTHONPATH": user_package, "COHORT_METRICS_PORT": str(free_port()),
                       "COHORT_PATH_MAP": json.dumps({"/checkpoints": str(tmp_path / "ck")}),
                       "COHORT_TERMINATION_LOG": str(tmp_path / "termination")})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # The same words as the termination message, which the operator quotes in the job's status.
    said = json.loads((tmp_path / "termination").read_text())
    assert list(said) == ["error"] and needle in said["error"], said


@pytest.mark.dist
def test_a_contract_1_package_trains_end_to_end(tmp_path, user_package):
    m = manifest("v1", workload={"model": "user_pkg:model", "dataset": "user_pkg:contract_1", "epochs": 0,
                                 "maxSteps": 6, "batchSize": 8})
    s = run_local(tmp_path, m, workers=1, env={"PYTHONPATH": user_package})
    assert s["step"] == 6, s
    logs = "".join(p.read_text() for p in (tmp_path / "run").glob("*.log"))
    assert "entry-point contract 1, deprecated" in logs


@pytest.mark.dist
@pytest.mark.parametrize("sync", [{"algorithm": "gossip"}, {"algorithm": "localsgd", "period": 2, "warmupSteps": 2}])
def test_replicas_that_train_apart_are_evaluated_in_eval_mode(tmp_path, user_package, sync):
    """Gossip and local SGD evaluate the replicas' average mid-training (steps 3 and 6) and at the end: every
    evaluation runs the model in eval mode (the user's model refuses one in training mode), dropout off."""
    m = manifest("modes", sync=sync, workload={"model": "user_pkg:EvalModeChecked", "dataset": "user_pkg:contract_2",
                                                 "modelArgs": {}, "epochs": 0, "maxSteps": 6, "batchSize": 8,
                                                 "evalEverySteps": 3})
    s = run_local(tmp_path, m, workers=2, env={"PYTHONPATH": user_package})
    assert s["step"] == 6 and s["restarts"] == 0 and s["worldVersions"] == 1, s  # no worker failed
    logs = (tmp_path / "run/modes-worker-0.log").read_text()
    assert [json.loads(line)["step"] for line in logs.splitlines() if '"evaluated"' in line] == [3, 6]
