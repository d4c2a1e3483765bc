"""Runs ``cohort-operator`` on a process node with its pod's service-account token.

Process nodes (hack/processnode, docs/processnodes.md) have no mount
namespace: a pod's projected service-account volume is written to a local
directory named in ``COHORT_PATH_MAP``, not to
/var/run/secrets/kubernetes.io/serviceaccount where the kubernetes client's
in-cluster loader looks. This points the loader at that directory and runs
the operator, which then authenticates as in a real cluster: as the pod's
ServiceAccount, with exactly its RBAC. There is no fallback to a kubeconfig.

The chart tests install the operator with ``operator.command`` set to
``[python, <this file>]``; the chart's flags follow as arguments.
"""

from __future__ import annotations

import json
import os
import sys

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def main() -> int:
    local = json.loads(os.environ.get("COHORT_PATH_MAP") or "{}").get(SA_DIR)
    if not local or not os.path.isfile(os.path.join(local, "token")):
        print(f"incluster: no service-account token mounted (COHORT_PATH_MAP has no {SA_DIR})", file=sys.stderr)
        return 2
    os.environ.pop("KUBECONFIG", None)  # only the pod's token, never a kubeconfig
    from kubernetes.config import incluster_config

    incluster_config.SERVICE_TOKEN_FILENAME = os.path.join(local, "token")
    incluster_config.SERVICE_CERT_FILENAME = os.path.join(local, "ca.crt")
    from cohort.operator.main import main as operator_main

    return operator_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
