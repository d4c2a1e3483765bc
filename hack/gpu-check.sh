#!/usr/bin/env bash
# A short check of the trainer on a machine with an NVIDIA GPU (not part of
# make test; CI has no GPU). Uses the machine's own python3 with torch and
# this checkout's api and trainer source. Prints what it saw; exits non-zero on failure.
#   hack/gpu-check.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/cohort-gpu-check}
mkdir -p "$out"
export PYTHONPATH=$PWD/api/src:$PWD/trainer/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "nccl", torch.distributed.is_nccl_available())'
python3 - <<'PY'
# Which backend and device a one-rank world of the trainer gets on this machine.
import os, torch, torch.distributed as dist
from cohort.trainer.runtime.process_group import backend_name
from cohort.trainer.parallel.mesh import device_type
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
dist.init_process_group(backend_name(), rank=0, world_size=1)
print("process group backend", dist.get_backend(), "| mesh device type", device_type())
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print("nccl all_reduce on cuda ok:", float(t[0]) == 1.0)
dist.destroy_process_group()
PY
/usr/bin/time -f "cohort run: %e s wall" python3 -m cohort.trainer.cli run examples/digits.yaml --local --workers 2 \
  --checkpoint-dir "$out/ckpt" 2>&1 | tail -n 8
