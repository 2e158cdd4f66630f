# clusterbake: `make image && make cluster` on one Debian 12 machine (as root).
# CONFIG=path selects another cluster config; FORCE=1 rebuilds the image;
# PROVIDER=aws uses examples/aws-p5.yaml unless CONFIG says otherwise.

PROVIDER ?= local
CONFIG ?= $(if $(filter aws,$(PROVIDER)),examples/aws-p5.yaml,clusterbake.yaml)
PYTHON ?= python3
VENV := .venv
CB := $(VENV)/bin/clusterbake --config $(CONFIG)
HOST_PACKAGES := systemd-container debootstrap packer iproute2 openssh-client openssh-server python3-venv git rsync
STAMP_VENV := $(VENV)/.installed
PY_SOURCES := src tests bench inventories examples scripts/jobs roles/node_join/files/clusterbake-node-join roles/cloud_boot/files/clusterbake-node-boot roles/slurm_power/files/clusterbake-power roles/slurm_accounting/files/clusterbake-slurm-accounts roles/slurm_accounting/files/clusterbake-tcp-quickack roles/slurm_exporter/files/clusterbake-slurm-exporter roles/notice_agent/files/clusterbake-notice-agent roles/node_health/files/clusterbake-health

.DEFAULT_GOAL := help
.PHONY: help deps venv validate image cluster job status destroy twin twin-destroy lint test test-unit test-integration bench

help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: ## Install the host packages (apt) the local provider needs
	@missing=$$(for p in $(HOST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "==> apt-get install $$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

$(STAMP_VENV): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c requirements.lock -e '.[dev]'
	touch $@

venv: $(STAMP_VENV) ## Create the Python venv with pinned dependencies

validate: venv ## Check the config file
	$(CB) validate

image: deps venv ## Build the node image (reused when inputs are unchanged; FORCE=1 rebuilds)
	$(CB) image build $(if $(FORCE),--force)

cluster: deps venv ## Boot and configure the cluster; ends with every compute node idle
	$(CB) cluster up

JOB_NAME ?= example-$(shell date +%Y%m%d-%H%M%S)
STEPS ?= 60
job: venv ## Train the DeepSpeed example on all compute nodes; summary; non-zero if it failed
	$(CB) job submit deepspeed --nodes all --upload examples/deepspeed --job-name $(JOB_NAME) --wait -- \
	  /shared/deepspeed/train.py --deepspeed_config /shared/deepspeed/ds_config.json --steps $(STEPS)

status: venv ## Nodes and their Slurm state
	$(CB) cluster status

destroy: venv ## Remove every node, network and mount of the cluster
	$(CB) cluster down

TWIN_CLOUD ?= aws
TWIN_CONFIG ?= examples/$(TWIN_CLOUD)-twin.yaml
TWIN_ENV = eval "$$($(VENV)/bin/clusterbake twin up $(TWIN_CLOUD))"
twin: deps venv ## A cloud's twin, then a cluster on it (TWIN_CLOUD=aws|azure, TWIN_CONFIG: examples/<cloud>-twin.yaml)
	$(TWIN_ENV) && $(VENV)/bin/clusterbake --config $(TWIN_CONFIG) cluster up

twin-destroy: venv ## Remove the twin's cluster, then the twin (its nodes, bridge and state)
	if $(VENV)/bin/clusterbake twin status $(TWIN_CLOUD) | grep -q '"running": true'; then \
	  $(TWIN_ENV) && $(VENV)/bin/clusterbake --config $(TWIN_CONFIG) cluster down; fi
	$(VENV)/bin/clusterbake twin down $(TWIN_CLOUD)

lint: venv ## ruff, yamllint, ansible-lint (production), packer fmt/validate
	$(VENV)/bin/ruff check $(PY_SOURCES)
	$(VENV)/bin/ruff format --check $(PY_SOURCES)
	$(VENV)/bin/yamllint -s .
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/ansible-lint --profile production ansible roles
	packer fmt -check packer
	scripts/packer-validate

# Tests that need no node run on every core (pytest-xdist, one worker per test file); the ones
# that boot nodes share the host's bridges and images, so they run one at a time, after them.
# The images the node tests boot (the suite's, the EC2 and Azure twins') build meanwhile, one
# after the other (the image store takes one build at a time); the node tests find them built.
OFFLINE_TESTS := tests/unit tests/aws tests/azure
NODE_TESTS := tests/integration tests/twin
TEST_IMAGES_LOG := build/test-images.log
TEST_IMAGES := $(VENV)/bin/clusterbake --config tests/integration/cluster.yaml image build \
	&& $(VENV)/bin/clusterbake twin image aws && $(VENV)/bin/clusterbake twin image azure

test: deps venv ## Unit and integration tests (builds the images they boot alongside the node-less tests)
	@mkdir -p build
	status=0; \
	echo "==> the node tests' images build in the background; log: $(TEST_IMAGES_LOG)"; \
	( $(TEST_IMAGES) ) >$(TEST_IMAGES_LOG) 2>&1 & images=$$!; \
	$(VENV)/bin/pytest -v -n auto --dist loadfile --durations=20 $(OFFLINE_TESTS) || status=$$?; \
	if wait $$images; then echo "==> the node tests' images are built"; \
	else echo "==> an image build failed (the node tests will say which); end of $(TEST_IMAGES_LOG):"; \
	  tail -n 40 $(TEST_IMAGES_LOG); fi; \
	$(VENV)/bin/pytest -v --durations=30 $(NODE_TESTS) || status=$$?; \
	exit $$status

test-unit: venv ## Unit tests only (no root, no nodes)
	$(VENV)/bin/pytest -v -n auto --dist loadfile $(OFFLINE_TESTS)

test-integration: deps venv ## Integration tests on a real local cluster
	$(VENV)/bin/pytest -v tests/integration

bench: deps venv ## Bring-up and training benchmarks (JSON in bench/results/)
	$(VENV)/bin/python bench/bringup.py
	$(VENV)/bin/python bench/training.py
