"""cohort.client without a cluster: argument parsing, trainer dispatch, the progress line, error wording."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cohort.client import TrainingJob, cli
from cohort.client.errors import ApiError, NotFound, api_error_message, from_api_exception
from cohort.client.progress import format_duration, format_goodput, format_progress, format_rate, progress_bar

REPO = Path(__file__).resolve().parents[2]
SPEC = {"workload": {"model": "mlp", "dataset": "digits"}}


def job(status: dict[str, Any] | None = None, name: str = "digits") -> TrainingJob:
    return TrainingJob.from_object({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob",
                                    "metadata": {"name": name, "namespace": "ns",
                                                 "creationTimestamp": "2026-01-01T00:00:00Z"},
                                    "spec": SPEC, "status": status or {}})


# --- argument parsing -----------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["submit", "job.yaml"], {"command": "submit", "manifest": "job.yaml", "watch": False, "namespace": None}),
    (["submit", "job.yaml", "--watch", "-n", "team"], {"watch": True, "namespace": "team"}),
    (["list", "--kubeconfig", "/k"], {"command": "list", "kubeconfig": "/k"}),
    (["status", "digits"], {"command": "status", "name": "digits"}),
    (["logs", "digits"], {"name": "digits", "rank": None, "follow": False}),
    (["logs", "digits", "--rank", "2", "-f"], {"rank": 2, "follow": True}),
    (["scale", "digits", "6"], {"command": "scale", "name": "digits", "replicas": 6}),
    (["delete", "digits"], {"command": "delete", "name": "digits"}),
])
def test_parses_the_cluster_commands(argv, expected):
    args = cli.build_parser().parse_args(argv)
    assert {k: getattr(args, k) for k in expected} == expected


@pytest.mark.parametrize("argv", [["scale", "digits", "six"], ["logs", "digits", "--rank", "x"], ["submit"], []])
def test_bad_usage_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_trainer_commands_go_to_the_trainer_cli_unchanged(monkeypatch):
    seen = []

    class FakeTrainerCli:
        @staticmethod
        def main(argv):
            seen.append(argv)
            return 7

    monkeypatch.setitem(sys.modules, "cohort.trainer.cli", FakeTrainerCli)
    for argv in (["run", "x.yaml", "--local", "--workers", "4"], ["plan", "x.yaml", "--gpus", "8"],
                 ["calibrate"], ["validate", "x.yaml"], ["train", "--config", "c.json"]):
        assert cli.main(argv) == 7
    assert seen[0] == ["run", "x.yaml", "--local", "--workers", "4"] and len(seen) == 5


# --- without torch, and without the trainer -------------------------------------------------

BLOCK = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = {blocked!r}
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
            return None
    sys.meta_path.insert(0, Block())
""")


def run_blocked(blocked: tuple[str, ...], body: str) -> subprocess.CompletedProcess[str]:
    code = BLOCK.format(blocked=blocked) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_client_and_cli_import_and_work_without_torch():
    out = run_blocked(("torch",), """
        import cohort.client, cohort.client.cli
        from cohort.client import Client, TrainingJob, format_progress
        from cohort.client.cli import main
        assert main(["validate", "examples/digits.yaml"]) == 0   # the trainer's validate needs no torch
        assert "torch" not in sys.modules
        print("ok")
    """)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr


def test_trainer_commands_without_the_trainer_say_how_to_install_it():
    out = run_blocked(("torch", "cohort.trainer"), """
        from cohort.client.cli import main
        sys.exit(main(["run", "examples/digits.yaml", "--local"]))
    """)
    assert out.returncode == 2, out.stderr
    assert "pip install cohort-trainer" in out.stderr and "cohort run" in out.stderr


def test_the_cli_runs_trainer_commands_without_the_kubernetes_package():
    """The trainer image installs the client with --no-deps: `cohort validate` must not need kubernetes."""
    out = run_blocked(("kubernetes",), """
        from cohort.client.cli import main
        rc = main(["validate", "examples/digits.yaml"])
        assert rc == 0, rc
        assert main(["list"]) == 1   # says what is missing instead of a traceback
    """)
    assert out.returncode == 0, out.stderr
    assert "need the kubernetes package" in out.stderr


def test_installing_the_client_in_a_fresh_virtualenv_pulls_no_torch(tmp_path):
    """pip resolves the client (and the API package it needs) for an empty virtualenv, from the package
    index as a user's pip would, and reports what it would install (a dry run: nothing is installed)."""
    venv, report = tmp_path / "venv", tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "--dry-run",
                          "--quiet", "--report", str(report), str(REPO / "api"), str(REPO / "client")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"cohort-client", "cohort-api", "kubernetes", "pyyaml"} <= names, names
    heavy = {n for n in names if n in ("torch", "triton", "kopf", "numpy", "cohort-trainer", "cohort-operator")
             or n.startswith("nvidia-")}
    assert not heavy, sorted(names)


# --- the progress line ---------------------------------------------------------------------

def test_progress_line_has_step_percent_eta_loss_world_and_recoveries():
    line = format_progress(job({
        "phase": "Running",
        "progress": {"step": 420, "percent": 42.0, "etaSeconds": 65, "loss": 0.312345,
                     "samplesPerSecond": 1234.0, "tokensPerSecond": 15000.0},
        "world": {"version": 3, "size": 4}, "replacements": {"failure": 1, "straggler": 1}}))
    assert line == ("digits Running    [########............]  42.0%  step 420  ETA 1m05s  loss 0.3123  "
                    "15.0k tok/s  world 4 (v3)  recoveries 2")


def test_progress_line_shows_samples_for_a_model_whose_tokens_are_its_samples():
    """A non-language model's ``tokensPerSecond`` is its samples per second (one token a sample, rounded apart)."""
    line = format_progress(job({"phase": "Succeeded", "progress": {"step": 330, "samplesPerSecond": 10237.3,
                                                                   "tokensPerSecond": 10240.0}}))
    assert "  10.2k samples/s  " in line, line
    assert "  950 samples/s  " in format_progress(job({"progress": {"samplesPerSecond": 950.0,
                                                                    "tokensPerSecond": 950.0}}))


def test_progress_line_before_the_first_step():
    line = format_progress(job())
    assert line == ("digits Pending    [                    ]      -  step 0  ETA -  loss -  - samples/s  "
                    "world 0 (v0)  recoveries 0")


def test_goodput_line_lists_the_ledgers_parts_largest_first():
    line = format_goodput(job({"goodput": {"percent": 71.4, "wallSeconds": 140.0, "seconds": {
        "training": 100.0, "starting": 25.0, "lostWork": 10.5, "recovery": 4.5, "queued": 0}}}))
    assert line == "71.4% of 2m20s: training 1m40s, starting 25.0s, lostWork 10.5s, recovery 4.5s"
    assert format_goodput(job()) is None  # nothing accounted yet


@pytest.mark.parametrize("seconds, text", [(None, "-"), (0, "0s"), (59.6, "1m00s"), (3599, "59m59s"),
                                           (3600, "1h00m"), (7384, "2h03m")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_rate_and_bar():
    assert [format_rate(v) for v in (None, 950.0, 12345.0, 2.5e6)] == ["-", "950", "12.3k", "2.50M"]
    assert progress_bar(100, 4) == "[####]" and progress_bar(0, 4) == "[....]" and progress_bar(150, 4) == "[####]"


def test_failure_reason_and_list_table():
    failed = job({"phase": "Failed", "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "11 workers failed (maxRestarts 10)"}]})
    assert failed.failure_reason() == "BackoffLimitExceeded: 11 workers failed (maxRestarts 10)"
    assert job({"phase": "Running"}).failure_reason() == ""
    table = cli.format_table([failed], now=datetime.datetime(2026, 1, 1, 0, 2, 5, tzinfo=datetime.timezone.utc))
    assert table.splitlines()[0].split() == ["NAME", "PHASE", "READY", "STEP", "PROGRESS", "ETA", "LOSS", "AGE"]
    assert table.splitlines()[1].split() == ["digits", "Failed", "0/0", "0", "-", "-", "-", "2m05s"]


# --- the API server's refusals, as kubectl words them ---------------------------------------------

INVALID_BODY = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
    "message": 'TrainingJob.cohort.dev "bad" is invalid: spec.replicas.min: Invalid value: 0: '
               'spec.replicas.min in body should be greater than or equal to 1',
    "details": {"name": "bad", "group": "cohort.dev", "kind": "TrainingJob", "causes": [
        {"reason": "FieldValueInvalid", "field": "spec.replicas.min",
         "message": "Invalid value: 0: spec.replicas.min in body should be greater than or equal to 1"}]},
}


def test_a_422_names_the_field_like_kubectl():
    message, reason, fields = api_error_message(422, json.dumps(INVALID_BODY))
    assert message == ('The TrainingJob "bad" is invalid: spec.replicas.min: Invalid value: 0: '
                       'spec.replicas.min in body should be greater than or equal to 1')
    assert reason == "Invalid" and fields == ("spec.replicas.min",)


def test_a_422_with_several_causes_lists_them():
    body = json.loads(json.dumps(INVALID_BODY))
    body["details"]["causes"].append({"field": "spec.replicas.target", "message": "Invalid value: 9: at most max"})
    message, _, fields = api_error_message(422, body)
    assert message.startswith('The TrainingJob "bad" is invalid: [spec.replicas.min: Invalid value: 0')
    assert message.endswith(", spec.replicas.target: Invalid value: 9: at most max]")
    assert fields == ("spec.replicas.min", "spec.replicas.target")


def test_other_refusals_read_like_kubectls_error_from_server():
    class Exc:
        status = 404
        reason = "Not Found"
        body = json.dumps({"kind": "Status", "reason": "NotFound", "code": 404,
                           "message": 'trainingjobs.cohort.dev "nope" not found'})

    err = from_api_exception(Exc())
    assert isinstance(err, NotFound) and isinstance(err, ApiError) and err.status == 404
    assert str(err) == 'Error from server (NotFound): trainingjobs.cohort.dev "nope" not found'
    strict = api_error_message(400, {"reason": "BadRequest", "message": 'strict decoding error: unknown field '
                                                                        '"spec.replica"'})
    assert strict[0] == 'Error from server (BadRequest): strict decoding error: unknown field "spec.replica"'
    assert api_error_message(500, b"not json")[0] == "Error from server (500): not json"


def test_events_of_one_second_come_in_the_order_they_happened():
    """core/v1 Events give whole seconds; the API server lists them by their random names. The order within a
    second is eventTime's (the operator sets it to the microsecond); an Event repeated later sorts by its last."""
    from kubernetes.client import CoreV1Event, V1ObjectMeta, V1ObjectReference

    from cohort.client.client import event_order

    def at(s: float) -> datetime.datetime:
        return datetime.datetime(2026, 12, 5, 13, 0, 0, tzinfo=datetime.timezone.utc) + datetime.timedelta(seconds=s)

    def event(name: str, first: float, last: float | None = None, micro: bool = True) -> CoreV1Event:
        whole = at(int(first))
        return CoreV1Event(metadata=V1ObjectMeta(name=name), involved_object=V1ObjectReference(), reason=name,
                       first_timestamp=whole, last_timestamp=at(int(last)) if last is not None else whole,
                       event_time=at(first) if micro else None)
    listed = [event("c-worldpublished", 1.9), event("a-running", 1.1, last=4.2), event("b-podcreated", 1.5),
              event("d-kubelet", 0.5, micro=False), event("e-succeeded", 3.0)]
    assert [e.reason for e in sorted(listed, key=event_order)] == \
        ["d-kubelet", "b-podcreated", "c-worldpublished", "e-succeeded", "a-running"]
