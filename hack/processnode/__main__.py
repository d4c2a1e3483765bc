"""Entry point: ``python -m processnode --kubeconfig K --cluster-dir D --nodes N`` (run from hack/).

``hack/processnodes.sh up`` starts it in the background and records its pid.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from .daemon import Daemon
from .nodes import NodeConfig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="processnode", description=__doc__)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--cluster-dir", required=True, type=Path)
    p.add_argument("--nodes", type=int, default=2, help="how many nodes (process-0, process-1, ...)")
    p.add_argument("--name-prefix", default="process-")
    p.add_argument("--path", action="append", default=[], help="directory put first on the pods' PATH (repeatable)")
    p.add_argument("--cpu", default="32")
    p.add_argument("--memory", default="64Gi")
    p.add_argument("--gpus", default="4", help="fake nvidia.com/gpu capacity per node")
    p.add_argument("--pods", default="110")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = NodeConfig(cpu=a.cpu, memory=a.memory, pods=a.pods, gpus=a.gpus)
    names = [f"{a.name_prefix}{i}" for i in range(a.nodes)]
    d = Daemon(a.kubeconfig, a.cluster_dir, names, cfg, a.path)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: d.stop.set())
    d.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
