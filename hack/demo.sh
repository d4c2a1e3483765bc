#!/usr/bin/env bash
# `make demo`: the main job end to end on the local cluster.
#
# Brings up (or reuses) the control plane with its real nodes (kubelet,
# containerd, the images built here), the CRDs and a dev operator, applies
# examples/demo.yaml, shows live progress while one worker is
# killed and another slowed, and ends with the final accuracy, the recovery
# times and the replacement counts. Leaves the cluster running (make cluster-down).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VENV=$("$HACK_DIR/venv.sh")
KUBECONFIG=$("$HACK_DIR/cluster.sh" up | tail -n 1)
export KUBECONFIG
COHORT_OPERATOR_ARGS=${COHORT_OPERATOR_ARGS:-"--namespace cohort-demo --namespace cohort-bench --progress-seconds 1 --resync-seconds 10"} "$HACK_DIR/operator.sh" up
exec "$VENV/bin/python" "$HACK_DIR/demo.py" "$@"
