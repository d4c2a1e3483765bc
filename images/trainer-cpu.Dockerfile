# syntax=docker/dockerfile:1
# The Cohort trainer image, CPU only: `cohort-train` (and `cohort`) with torch's
# CPU build, running as a non-root user (UID 1000, the worker pods' default).
# Build from the repository root (images/build.sh):
#   docker build -f images/trainer-cpu.Dockerfile -t cohort-trainer:0.1.0 .
# The base image is pinned by version tag; images/README.md says how to pin its digest.

FROM python:3.11.14-slim-bookworm AS build
# torch's CPU-only wheels (no CUDA libraries: a much smaller image).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The trainer's dependencies at the versions the project pins (hack/requirements.txt, its one list).
COPY hack/requirements.txt hack/requirements.txt
RUN grep -E '^torch==' hack/requirements.txt > /tmp/torch.txt \
 && grep -E '^(numpy|scikit-learn|pyyaml|prometheus-client)==' hack/requirements.txt > /tmp/requirements.txt \
 && test "$(wc -l < /tmp/torch.txt)" -eq 1 && test "$(wc -l < /tmp/requirements.txt)" -eq 4 \
 && python -m venv /opt/cohort \
 && /opt/cohort/bin/pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" -r /tmp/torch.txt \
 && /opt/cohort/bin/pip install --no-cache-dir -r /tmp/requirements.txt
COPY trainer/ trainer/
RUN /opt/cohort/bin/pip install --no-cache-dir --no-deps ./trainer \
 && /opt/cohort/bin/python -m compileall -q /opt/cohort/lib

FROM python:3.11.14-slim-bookworm
LABEL org.opencontainers.image.title="cohort-trainer" \
      org.opencontainers.image.description="Cohort trainer (CPU): elastic distributed PyTorch training" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 1000 cohort \
 && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/cohort --shell /usr/sbin/nologin cohort
COPY --from=build /opt/cohort /opt/cohort
ENV PATH=/opt/cohort/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/cohort
WORKDIR /home/cohort
USER 1000:1000
# /metrics, /healthz and /progress; rendezvous (TCPStore on rank 0)
EXPOSE 9400 29400
CMD ["cohort-train", "--config", "/etc/cohort/job.json"]
