# driftscope: `make up` sets up and runs the collector + dashboard; `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: up install dev test test-fast lint format bench bench-smoke sample-traces chromium clean

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "driftscope needs Python 3.11 ($(PYTHON) not found)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch is pinned to 2.13.0 in pyproject.toml: the CPU build, so set-up never pulls a CUDA build.
# setup.py compiles the OTLP decoder (collector/_otlpfast.c) into the editable install, so a C
# compiler is needed (Debian's gcc is installed if there is none).
$(VENV)/.installed: pyproject.toml setup.py collector/_otlpfast.c | $(PY)
	@command -v cc >/dev/null 2>&1 || { echo "installing gcc to build the OTLP decoder"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null; }
	$(PIP) install --quiet -e '.[server]'
	$(PY) -c "import collector._otlpfast" || { echo "the compiled OTLP decoder did not build"; exit 1; }
	@touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PIP) install --quiet -e '.[dev]'
	@touch $@

install: $(VENV)/.installed

dev: $(VENV)/.installed-dev

up: install
	$(VENV)/bin/driftscope up

# Debian's chromium for the browser tests (Playwright drives it; `playwright install` cannot work here).
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
		echo "installing Debian's chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi

lint: dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: dev chromium lint
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q -p no:cacheprovider

# The inner loop: everything but the tests marked slow (browser, crash safety, overload, big data).
test-fast: dev
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q -p no:cacheprovider -m "not slow" -x

bench: dev
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.run

bench-smoke: dev
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.run --smoke

sample-traces: dev
	$(PY) -m guards.simulator regenerate sample_traces/

clean:
	rm -rf $(VENV) driftscope-data test-artifacts
