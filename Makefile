# Cohort's front door. Everything a user or CI needs starts here.
#   make demo   - the main job end to end on a local cluster (builds what it needs)
#   make test   - set up from a clean clone and run every test tier
SHELL := /bin/bash
.DEFAULT_GOAL := help
.PHONY: help venv binaries setup cluster-up cluster-down crds check-generated lint test test-unit demo bench docs clean-cache

# The cached virtualenv (outside the repo, keyed by hack/requirements.txt).
VENV = $(shell hack/venv.sh)
PY = $(VENV)/bin/python
export PYTHONUNBUFFERED := 1

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 18

venv:  ## create/refresh the cached virtualenv (torch, kopf, dev tools; api, client, operator and trainer editable)
	@hack/venv.sh

binaries:  ## build the pinned control-plane binaries into ~/.cache/cohort/bin (once)
	@hack/build-binaries.sh

setup:  ## what the tests and the demo need, cold or checked warm: the binaries beside the virtualenv and the images
	@hack/setup.sh

cluster-up: binaries  ## start (or reuse) the local control plane; kubeconfig: ~/.cache/cohort/cluster/kubeconfig
	@hack/cluster.sh up

cluster-down:  ## stop every process hack/ started for the local cluster
	@hack/cluster.sh down

crds:  ## regenerate crds/, the chart's CRD and docs/api.md from the API models (api/)
	@$(PY) -m cohort.api.generate

check-generated:  ## fail if generated files are stale
	@$(PY) -m cohort.api.generate --check

lint:  ## ruff everywhere, mypy on the API, the client, the operator and the trainer
	@$(VENV)/bin/ruff check .
	@cd api && $(VENV)/bin/mypy src
	@cd client && $(VENV)/bin/mypy src
	@cd operator && $(VENV)/bin/mypy src
	@cd trainer && $(VENV)/bin/mypy src

test: setup  ## everything: the binaries, virtualenv and images (setup), lint, generated files, unit, dist, k8s integration and e2e tests
	@$(MAKE) --no-print-directory lint check-generated
	@$(PY) -m pytest $(PYTEST_ARGS)

test-unit:  ## only the tests that need no cluster and no process group
	@$(PY) -m pytest -m "not k8s and not dist and not e2e" $(PYTEST_ARGS)

demo: setup  ## the main job end to end on the local cluster: train, kill a worker, slow one, recover
	@hack/demo.sh

bench:  ## run every benchmark (prints comparison tables; not tests)
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

.PHONY: user-image load-image
user-image:  ## build your image (IMAGE=, DOCKERFILE=, CONTEXT=; FROM cohort-trainer works) and load it into the real nodes
	@hack/user-image.sh build "$(IMAGE)" "$(DOCKERFILE)" $(CONTEXT)

load-image:  ## import IMAGE (a name in buildah's storage, or a docker/OCI archive) into every real node, like kind load
	@hack/user-image.sh load "$(IMAGE)"

.PHONY: images
images: binaries  ## build the images here without Docker (Debian base, buildah) and import them into running real nodes
	@hack/nodes.sh images
