# syntax=docker/dockerfile:1
# The Cohort trainer image with CUDA: `cohort-train` (what a worker runs) with torch's
# default Linux build, whose wheels bring the CUDA runtime, cuDNN and NCCL as
# Python packages, so the base stays a slim Python and only the node's NVIDIA
# driver is needed (through the NVIDIA container toolkit). Runs as a non-root
# user (UID 65532, the worker pods' default). Build from the repository root:
#   docker build -f images/trainer-cuda.Dockerfile -t cohort-trainer:0.1.0-cuda .
# The base image is pinned by version tag; images/README.md says how to pin its digest.
# BASE_IMAGE: any Debian bookworm with Python 3.11 and venv (hack/images.sh passes one
# made from Debian's packages).
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${BASE_IMAGE} AS deps
# Empty: the package index's default torch build (CUDA on Linux x86_64). Set it to
# a PyTorch wheel index of a given CUDA version to choose another one.
ARG TORCH_INDEX_URL=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The trainer's dependencies at the versions the project pins (hack/requirements.txt, its one list).
COPY hack/requirements.txt hack/requirements.txt
RUN grep -E '^torch==' hack/requirements.txt > /tmp/torch.txt \
 && grep -E '^(numpy|scikit-learn|pyyaml|prometheus-client)==' hack/requirements.txt > /tmp/requirements.txt \
 && grep -E '^tokenizers==' hack/requirements.txt > /tmp/tokenizers.txt \
 && test "$(wc -l < /tmp/torch.txt)" -eq 1 && test "$(wc -l < /tmp/requirements.txt)" -eq 4 \
 && python -m venv /opt/cohort \
 && /opt/cohort/bin/pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} -r /tmp/torch.txt \
 && /opt/cohort/bin/pip install --no-cache-dir -r /tmp/requirements.txt \
 && /opt/cohort/bin/pip install --no-cache-dir --no-deps -r /tmp/tokenizers.txt \
 && /opt/cohort/bin/python -m compileall -q -x 'torch/testing/_internal/py3[1-9][0-9]_' /opt/cohort/lib

# The project in a directory of its own, so that a code change leaves the
# multi-GB dependency layer above unchanged (and cached by the builder and the nodes).
FROM deps AS build
COPY api/ api/
COPY trainer/ trainer/
RUN /opt/cohort/bin/pip install --no-cache-dir --target /opt/cohort-app --no-deps ./api ./trainer \
 && /opt/cohort/bin/python -m compileall -q /opt/cohort-app

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="cohort-trainer" \
      org.opencontainers.image.description="Cohort trainer (CUDA): elastic distributed PyTorch training" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 65532 cohort \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin cohort
COPY --from=deps /opt/cohort /opt/cohort
COPY --from=build /opt/cohort-app /opt/cohort-app
ENV PATH=/opt/cohort-app/bin:/opt/cohort/bin:$PATH PYTHONPATH=/opt/cohort-app PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
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
