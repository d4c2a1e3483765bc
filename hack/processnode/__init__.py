"""Process nodes: a development kubelet that runs pods as local processes.

The daemon (``python -m processnode``, started by ``hack/processnodes.sh up``)
registers Node objects and, for every pod bound to them, runs each container's
command on this machine with its own loopback IP. See docs/processnodes.md.

Modules, one concept each:
- ``kube``: a small JSON client for the API server (requests, list+watch);
- ``nodes``: Node registration, Lease heartbeats and node status;
- ``ipam``: loopback IPs for pods, allocated under a file lock;
- ``podspec``: pure helpers: env resolution, ``$(VAR)`` expansion, path mapping;
- ``volumes``: volumes as local directories, kept up to date;
- ``provisioner``: a StorageClass whose PVCs are local directories;
- ``probes``: readiness, liveness and startup probes;
- ``status``: pure builders of pod status;
- ``container``: one container's process: start, restart, stop;
- ``pod``: one pod's lifecycle, from sandbox to deletion;
- ``daemon``: the watches that tie it together.
"""
