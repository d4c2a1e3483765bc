# syntax=docker/dockerfile:1
# The Cohort trainer image, CPU only: `cohort-train` (what a worker runs) with torch's
# CPU build, running as a non-root user (UID 65532, the worker pods' default).
# Build from the repository root (images/build.sh):
#   docker build -f images/trainer-cpu.Dockerfile -t cohort-trainer:0.1.0 .
# The base image is pinned by version tag; images/README.md says how to pin its digest.
# BASE_IMAGE: any Debian bookworm with Python 3.11 and venv; `make images` passes one
# made from Debian's packages (hack/images.sh), since no registry is reachable there.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

# The project alone, in a directory of its own: the final image copies it in
# last, so a code change leaves the multi-GB dependency layer unchanged (and
# cached by the builder and the nodes).
FROM ${BASE_IMAGE} AS app
WORKDIR /src
COPY api/ api/
COPY trainer/ trainer/
# pip writes the scripts in bin/ for the interpreter it runs under: the venv the
# final image has at the same path.
RUN python -m venv /opt/cohort \
 && /opt/cohort/bin/pip install --no-cache-dir --target /opt/cohort-app --no-deps ./api ./trainer \
 && python -m compileall -q /opt/cohort-app

FROM ${BASE_IMAGE}
# TORCH_INDEX_URL: a wheel index serving torch's CPU-only build makes a much
# smaller image (images/README.md); empty means pip's configured index, whose
# Linux torch is the CUDA build (it runs on the CPU too).
ARG TORCH_INDEX_URL=""
LABEL org.opencontainers.image.title="cohort-trainer" \
      org.opencontainers.image.description="Cohort trainer (CPU): elastic distributed PyTorch training" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 65532 cohort \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin cohort
# The trainer's dependencies at the versions the project pins (hack/requirements.txt,
# its one list), installed where they stay: one layer, written once (no build
# stage to copy gigabytes from). torch's Linux wheel pulls in triton, the GPU
# compiler behind torch.compile (0.7 GB), which a CPU image never runs: removed.
COPY hack/requirements.txt /tmp/pins/hack/requirements.txt
RUN cd /tmp/pins \
 && grep -E '^torch==' hack/requirements.txt > torch.txt \
 && grep -E '^(numpy|scikit-learn|pyyaml|prometheus-client)==' hack/requirements.txt > deps.txt \
 && grep -E '^tokenizers==' hack/requirements.txt > tokenizers.txt \
 && test "$(wc -l < torch.txt)" -eq 1 && test "$(wc -l < deps.txt)" -eq 4 && test "$(wc -l < tokenizers.txt)" -eq 1 \
 && python -m venv /opt/cohort \
 && /opt/cohort/bin/pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} -r torch.txt \
 && /opt/cohort/bin/pip uninstall -y -q triton \
 && /opt/cohort/bin/pip install --no-cache-dir -r deps.txt \
 && /opt/cohort/bin/pip install --no-cache-dir --no-deps -r tokenizers.txt \
 && /opt/cohort/bin/python -m compileall -q -x 'torch/testing/_internal/py3[1-9][0-9]_' /opt/cohort/lib \
 && cd / && rm -rf /tmp/pins
COPY --from=app /opt/cohort-app /opt/cohort-app
# The root file system is read-only in a worker pod: HOME is /tmp, an emptyDir there.
ENV PATH=/opt/cohort-app/bin:/opt/cohort/bin:$PATH PYTHONPATH=/opt/cohort-app PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
# python-source's shards at their default settings, prepared by this image's Python so that no worker
# prepares them (workloads/python_source.py: about 11 s of CPU and 0.85 GB each); read only in a pod,
# looked in before the cache. 7 MB.
RUN python -m cohort.trainer.workloads.python_source /opt/cohort-data && rm -f /opt/cohort-data/*.lock
ENV COHORT_DATA_PREPARED=/opt/cohort-data
WORKDIR /tmp
USER 65532:65532
# /metrics, /healthz and /progress; rendezvous (TCPStore on rank 0)
EXPOSE 9400 29400
CMD ["cohort-train", "--config", "/etc/cohort/job.json"]
