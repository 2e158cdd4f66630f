# clusterbake: `make image && make cluster` on one Debian 12 machine (as root).
# CONFIG=path selects another cluster config; FORCE=1 rebuilds the image;
# PROVIDER=aws uses examples/aws-p5.yaml unless CONFIG says otherwise.

PROVIDER ?= local
CONFIG ?= $(if $(filter aws,$(PROVIDER)),examples/aws-p5.yaml,clusterbake.yaml)
PYTHON ?= python3
VENV := .venv
CB := $(VENV)/bin/clusterbake --config $(CONFIG)
# nftables: the tests load the cloud nodes' metadata guard (roles/cloud_boot) into a namespace.
HOST_PACKAGES := systemd-container debootstrap packer iproute2 openssh-client openssh-server python3-venv git rsync nftables
# The tests' own: a directory server the local cluster's SSSD reads (tests/integration/directory.py),
# run by the tests as a process of their own (never the system's slapd: it is left unconfigured).
TEST_PACKAGES := slapd ldap-utils openssl
STAMP_VENV := $(VENV)/.installed
# The node programs (roles/*/files) are Python without a .py name: found by their shebang.
NODE_PROGRAMS := $(shell grep -ls '^\#!.*python' roles/*/files/*) $(wildcard roles/*/files/*/*.py)
PY_SOURCES := src tests bench inventories examples scripts/jobs $(NODE_PROGRAMS)

.DEFAULT_GOAL := help
.PHONY: help deps test-deps venv lock validate image cluster job status destroy twin twin-destroy lint test test-unit test-integration bench

help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: ## Install the host packages (apt) the local provider needs
	@missing=$$(for p in $(HOST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "==> apt-get install $$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

test-deps: deps ## Install the host packages the tests need besides the provider's (apt)
	@missing=$$(for p in $(TEST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "==> apt-get install $$missing"; \
	  echo 'slapd slapd/no_configuration boolean true' | debconf-set-selections; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

# Every distribution, setuptools included, checked against the lock's hashes (pip is the one
# Python brought); then the project itself, with nothing more fetched.
$(STAMP_VENV): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --require-hashes -r requirements.lock
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $@

lock: venv ## Regenerate requirements.lock with hashes; keeps the venv's versions unless UPGRADE=1
	test -x build/pip-tools/bin/pip-compile || { $(PYTHON) -m venv build/pip-tools && build/pip-tools/bin/pip install -q pip-tools; }
	$(VENV)/bin/pip freeze --exclude-editable > build/venv-freeze.txt
	build/pip-tools/bin/pip-compile -q --generate-hashes --extra dev --strip-extras --allow-unsafe \
	  --build-deps-for editable --no-emit-index-url --no-emit-find-links \
	  $(if $(UPGRADE),--upgrade,--constraint build/venv-freeze.txt) --output-file requirements.lock pyproject.toml

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
	  deepspeed/train.py --deepspeed_config deepspeed/ds_config.json --steps $(STEPS)

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

# `make test` is tests/suite.py: the node-less tests on every core (pytest-xdist) while the images
# the node tests boot build in the background (the suite's, then each twin's as a layer on it);
# then the node tests in lanes side by side (each lane's clusters on their own bridges), and a
# module that changes the host for every cluster alone after them. It ends with the time table
# (build/test-times.json: phases, lanes, modules, fixtures, cluster boots); lane logs in build/.
OFFLINE_TESTS := tests/unit tests/aws tests/azure tests/security

test: test-deps venv ## Unit and integration tests (builds the images they boot), then the time table
	$(VENV)/bin/python tests/suite.py

test-unit: venv ## Unit tests only (no root, no nodes)
	$(VENV)/bin/pytest -v -n $$(( 2 * $$(nproc) )) --dist loadfile $(OFFLINE_TESTS)

test-integration: test-deps venv ## Integration tests on a real local cluster
	$(VENV)/bin/pytest -v tests/integration

bench: deps venv ## Bring-up and training benchmarks (JSON in bench/results/)
	$(VENV)/bin/python bench/bringup.py
	$(VENV)/bin/python bench/training.py
