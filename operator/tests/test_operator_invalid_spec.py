"""A stored spec the operator cannot run ends the job cleanly (issue 32 item 2), without a cluster.

Admission refuses what the operator cannot parse (tests/contract/test_admission_parity.py), so these
specs come from before a CRD upgrade; here they are made by hand and refused by the operator's parser.
"""

from __future__ import annotations

import datetime as dt

import pytest

from cohort.api.models import TrainingJobSpec, TrainingJobStatus
from cohort.api.schema import ValidationError, parse
from cohort.operator.decide.invalid import Refused, decide_invalid
from cohort.operator.kueue import Delete, Finish, Slice, finish, plan
from cohort.operator.lifecycle import fmt_time, get_condition
from cohort.operator.observe import PodView
from cohort.operator.world import Member, World

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
# Admitted by the CRD before issue 32 (its pattern was matched anywhere in the string).
STALE_SPEC = {"workload": {"model": "mlp-v2", "dataset": "digits"}, "replicas": {"min": 2, "max": 4, "target": 2}}


def refusal(spec: dict) -> str:
    with pytest.raises(ValidationError) as err:
        parse(TrainingJobSpec, spec)
    return str(err.value)


def job(generation: int = 1, spec: dict | None = None) -> dict:
    return {"metadata": {"name": "j", "namespace": "ns", "uid": "job-uid", "generation": generation},
            "spec": spec or STALE_SPEC}


def pod(i: int, **kw) -> PodView:
    return PodView(name=f"j-worker-{i}", uid=f"u{i}", index=i, ip=f"10.0.0.{i}", node="n1", phase="Running",
                   ready=True, **kw)


def test_a_new_job_with_a_spec_it_cannot_run_fails_at_once():
    message = refusal(STALE_SPEC)
    assert message.startswith("spec.workload.model:")
    plan_ = decide_invalid(Refused(job=job(), status=TrainingJobStatus(), world=World(), pods=[], now=NOW,
                                   message=message))
    st = plan_.status
    assert st.phase == "Failed" and st.completion_time == fmt_time(NOW)  # not Pending with Failed=True
    failed = get_condition(st.conditions, "Failed")
    assert failed.status == "True" and failed.reason == "InvalidSpec" and failed.message == message
    assert failed.observed_generation == 1
    assert get_condition(st.conditions, "Running").status == "False"
    assert get_condition(st.conditions, "Ready").status == "False"
    assert plan_.create == [] and plan_.delete == {}
    assert [(e.type, e.reason) for e in plan_.events] == [("Warning", "InvalidSpec")]
    assert message in plan_.events[0].message


def test_a_running_job_patched_to_such_a_spec_fails_and_its_pods_go():
    message = refusal(STALE_SPEC)
    running = TrainingJobStatus(phase="Running", start_time=fmt_time(NOW - dt.timedelta(minutes=5)), pod_index=3)
    running.replicas.active = running.replicas.ready = running.replicas.desired = 2
    w = World(version=2, members=(Member("j-worker-0", "u0", "10.0.0.0"), Member("j-worker-2", "u2", "10.0.0.2")))
    pods = [pod(0), pod(2), pod(1, failed=True, exit_code=1), pod(3, terminating=True)]
    plan_ = decide_invalid(Refused(job=job(generation=2), status=running, world=w, pods=pods, now=NOW,
                                   message=message))
    st = plan_.status
    assert st.phase == "Failed"  # not Running with Failed=True while the pods train unwatched
    assert get_condition(st.conditions, "Failed").reason == "InvalidSpec"
    assert get_condition(st.conditions, "Ready").status == "False"  # Ready=True and Failed=True at once before
    assert get_condition(st.conditions, "Running").status == "False"
    assert set(plan_.delete) == {"j-worker-0", "j-worker-2"}  # the live ones; the others are going already
    assert all(why.startswith("InvalidSpec: spec.workload.model") for why in plan_.delete.values())
    assert st.replicas.active == st.replicas.ready == 0 and st.observed_generation == 2
    assert plan_.create == [] and st.pod_index == 4


def test_a_failed_job_stays_failed_quietly_and_a_finished_one_keeps_its_phase():
    message = refusal(STALE_SPEC)
    first = decide_invalid(Refused(job=job(), status=TrainingJobStatus(), world=World(), pods=[], now=NOW,
                                   message=message))
    again = decide_invalid(Refused(job=job(), status=first.status, world=World(), pods=[],
                                   now=NOW + dt.timedelta(minutes=1), message=message))
    assert again.status == first.status and again.events == [] and again.delete == {}
    done = TrainingJobStatus(phase="Succeeded", completion_time=fmt_time(NOW))
    later = decide_invalid(Refused(job=job(), status=done, world=World(), pods=[pod(0)], now=NOW, message=message))
    assert later.status.phase == "Succeeded" and get_condition(later.status.conditions, "Failed") is None
    assert list(later.delete) == ["j-worker-0"] and later.events == []


def test_ttl_after_finished_applies_when_it_can_be_read():
    message = refusal(STALE_SPEC)
    failed = decide_invalid(Refused(job=job(), status=TrainingJobStatus(), world=World(), pods=[], now=NOW,
                                    message=message, ttl_seconds_after_finished=60))
    assert failed.requeue_after == pytest.approx(60) and not failed.delete_job
    gone = decide_invalid(Refused(job=job(), status=failed.status, world=World(), pods=[],
                                  now=NOW + dt.timedelta(seconds=61), message=message, ttl_seconds_after_finished=60))
    assert gone.delete_job


def _slice(name: str, ordinal: int, admitted: bool) -> Slice:
    return Slice(name=name, ordinal=ordinal, asks="a", workers=2, spares=None, admitted=admitted,
                 admitted_workers=2 if admitted else 0, admitted_spares=0, flavors=(), finished=False,
                 replaced=False, evicted=False, reason="", message="", replaces="")


def test_its_workloads_finish_without_the_spec():
    """The quota goes back: admitted Workloads are marked Finished with the reason, pending ones deleted,
    with nothing read from the spec (the reconciler cannot parse it); plan() does the same for a finished job."""
    message = refusal(STALE_SPEC)
    slices = [_slice("j-q1", 1, admitted=True), _slice("j-q2", 2, admitted=False)]
    actions = finish(slices, "Failed", "InvalidSpec", message)
    assert actions == [Finish("j-q1", "InvalidSpec", message), Delete("j-q2", "the job Failed")]
    valid = parse(TrainingJobSpec, {**STALE_SPEC, "workload": {"model": "mlp", "dataset": "digits"}})
    assert plan(job(), valid, slices, {}, phase="Failed", finish_reason="InvalidSpec", finish_message=message,
                active_pods=2, training=False) == actions
