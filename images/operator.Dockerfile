# syntax=docker/dockerfile:1
# The Cohort operator image: `cohort-operator` in a virtualenv on a slim Python,
# running as a non-root user. Build from the repository root (images/build.sh):
#   docker build -f images/operator.Dockerfile -t cohort-operator:0.1.0 .
# The base image is pinned by version tag; images/README.md says how to pin its digest.
# BASE_IMAGE: any Debian bookworm with Python 3.11 and venv; `make images` passes one
# made from Debian's packages (hack/images.sh), since no registry is reachable there.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The operator's dependencies at the versions the project pins (hack/requirements.txt, its one list).
COPY hack/requirements.txt hack/requirements.txt
RUN grep -E '^(kopf|kubernetes|aiohttp|pyyaml|prometheus-client)==' hack/requirements.txt > /tmp/requirements.txt \
 && test "$(wc -l < /tmp/requirements.txt)" -eq 5 \
 && python -m venv /opt/cohort \
 && /opt/cohort/bin/pip install --no-cache-dir -r /tmp/requirements.txt
COPY api/ api/
COPY operator/ operator/
# The root file system is read-only at run time: byte-compile now.
RUN /opt/cohort/bin/pip install --no-cache-dir --no-deps ./api ./operator \
 && /opt/cohort/bin/python -m compileall -q /opt/cohort/lib

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="cohort-operator" \
      org.opencontainers.image.description="Cohort operator: elastic distributed PyTorch training on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 65532 cohort \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin cohort
COPY --from=build /opt/cohort /opt/cohort
ENV PATH=/opt/cohort/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
# /metrics, and /healthz + /readyz
EXPOSE 8080 8081
ENTRYPOINT ["cohort-operator"]
