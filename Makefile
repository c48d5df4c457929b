# The two commands a newcomer needs: `make test` and `make demo`. Each sets up what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test lint unit system-packages stack-fetch stack-up stack-down demo demo-down images clean-venv

$(BIN)/.installed: pyproject.toml stack/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -e ./stack
	touch $@

lint: $(BIN)/.installed
	$(BIN)/ruff check operator stack tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/hadolint --no-color Dockerfile

unit: $(BIN)/.installed
	$(BIN)/pytest tests/unit -q

system-packages:
	@tools/system-packages.sh

stack-fetch: $(BIN)/.installed system-packages
	$(BIN)/fibers-stack fetch

# Lint, then every test: unit tests first, then the real local stack (built or fetched into the
# cache on first use, started once for the run, stopped at the end).
test: lint stack-fetch
	$(BIN)/pytest $(PYTEST_ARGS)

stack-up: stack-fetch
	$(BIN)/fibers-stack up

stack-down: $(BIN)/.installed
	$(BIN)/fibers-stack down

# The sample pipeline of examples/ on the local stack, with a live view; the stack keeps running.
demo: stack-fetch
	$(BIN)/fibers-stack demo

demo-down: stack-down

# The operator's two images (the Dockerfile's operator and job targets), built with buildah and pushed to
# REGISTRY (e.g. make images REGISTRY=registry.example.com/platform; log in first with buildah login), or to
# the running local stack's registry without it. Writes the chart's image values, by digest, to VALUES.
VALUES ?= fibers-images.yaml
# Needs only buildah and debootstrap (the image builds) and Go >= 1.25 (helm, built on first use), not the
# local stack's packages.
images: $(BIN)/.installed
	@for tool in buildah debootstrap go; do command -v $$tool >/dev/null || { \
	  echo "make images needs $$tool: apt-get install buildah debootstrap; Go >= 1.25 from go.dev" >&2; exit 1; }; done
	$(BIN)/fibers-stack images $(if $(REGISTRY),--push $(REGISTRY)) $(if $(CERT_DIR),--cert-dir $(CERT_DIR)) $(if $(VALUES),--values $(VALUES))

clean-venv:
	rm -rf $(VENV)
