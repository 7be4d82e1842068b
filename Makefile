# driftscope: `make up` sets up and runs the collector + dashboard; `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: up install dev test test-fast test-deep lint format bench bench-smoke bench-shapes sample-traces chromium alertmanager clean screenshots

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

# Debian's Prometheus Alertmanager for the alerting end-to-end tests (tests/e2e/test_alertmanager.py).
alertmanager:
	@if [ ! -x /usr/bin/prometheus-alertmanager ]; then \
		echo "installing Debian's prometheus-alertmanager for the alerting tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus-alertmanager >/dev/null; \
	fi

lint: dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Every test, as CI runs it (docs/testing.md): one pytest-xdist worker per core; a file's tests stay
# on one worker (--dist loadfile), so a module fixture (one shared serve) is built once.
PYTEST_PARALLEL ?= -n auto --dist loadfile

# The decoder fuzz tests run a fifth of their examples here (~20,000 inputs, unsanitized); CI runs
# the full count under AddressSanitizer + UBSan afterwards (.ci/run: make fuzz-sanitize).
TEST_FUZZ_SCALE ?= 0.2

test: dev chromium alertmanager lint
	HF_HUB_OFFLINE=1 DRIFTSCOPE_FUZZ_SCALE=$${DRIFTSCOPE_FUZZ_SCALE:-$(TEST_FUZZ_SCALE)} $(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) -m "not deep"

# make test plus the further random seeds of the property tests (marked deep).
test-deep: dev chromium alertmanager
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_PARALLEL)

# The decoder fuzz tests against an AddressSanitizer + UBSan build of collector/_otlpfast.c, built
# into a temporary directory (the checkout's build is untouched); DRIFTSCOPE_FUZZ_SCALE scales the examples.
fuzz-sanitize: dev
	HF_HUB_OFFLINE=1 $(PY) -m tests.fuzz_sanitize

.PHONY: fuzz-sanitize

# The inner loop: everything but the tests marked slow (browser, crash safety, overload, big data),
# the fuzz tests at make test's scale and the random-batch properties with fewer batches (tests/tiers.py).
test-fast: dev
	HF_HUB_OFFLINE=1 DRIFTSCOPE_TEST_QUICK=1 DRIFTSCOPE_FUZZ_SCALE=$${DRIFTSCOPE_FUZZ_SCALE:-$(TEST_FUZZ_SCALE)} $(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) -m "not slow and not deep" -x

bench: dev
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.run

bench-smoke: dev
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.run --smoke

# Issue 14: every detector on each crew shape at 1M stored spans (make bench also runs 10M).
bench-shapes: dev
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.run --only shapes --shape-spans 1000000

# Every dashboard page and the HTML report of the sample crews in Chromium at 1600x1000, for a
# person to look at (tests/e2e/screenshots.py): test-artifacts/screenshots/*.png.
screenshots: dev chromium
	HF_HUB_OFFLINE=1 $(PY) -m tests.e2e.screenshots test-artifacts/screenshots

sample-traces: dev
	$(PY) -m guards.simulator regenerate sample_traces/

clean:
	rm -rf $(VENV) driftscope-data test-artifacts

# The real-framework corpus (sample_traces/frameworks/): each framework driven by scripted models in
# venvs of its own, pinned in corpus/requirements-*.txt (never the project's dependencies). CrewAI
# has a venv of its own: it needs openai<3, the OpenAI Agents SDK openai>=3.
FW_VENV := .venv-frameworks
CREWAI_VENV := .venv-crewai
ADK_VENV := .venv-adk
STRANDS_VENV := .venv-strands
AF_VENV := .venv-agent-framework
AG2_VENV := .venv-ag2
FW_RUN_SETS := smolagents langgraph-openinference langgraph-openllmetry openai-agents pydantic-ai

$(FW_VENV)/.installed: corpus/requirements-frameworks.txt
	$(PYTHON) -m venv $(FW_VENV)
	$(FW_VENV)/bin/python -m pip install --quiet -r corpus/requirements-frameworks.txt
	@touch $@

$(CREWAI_VENV)/.installed: corpus/requirements-crewai.txt
	$(PYTHON) -m venv $(CREWAI_VENV)
	$(CREWAI_VENV)/bin/python -m pip install --quiet -r corpus/requirements-crewai.txt
	@touch $@

$(ADK_VENV)/.installed: corpus/requirements-adk.txt
	$(PYTHON) -m venv $(ADK_VENV)
	$(ADK_VENV)/bin/python -m pip install --quiet -r corpus/requirements-adk.txt
	@touch $@

$(STRANDS_VENV)/.installed: corpus/requirements-strands.txt
	$(PYTHON) -m venv $(STRANDS_VENV)
	$(STRANDS_VENV)/bin/python -m pip install --quiet -r corpus/requirements-strands.txt
	@touch $@

$(AF_VENV)/.installed: corpus/requirements-agent-framework.txt
	$(PYTHON) -m venv $(AF_VENV)
	$(AF_VENV)/bin/python -m pip install --quiet -r corpus/requirements-agent-framework.txt
	@touch $@

$(AG2_VENV)/.installed: corpus/requirements-ag2.txt
	$(PYTHON) -m venv $(AG2_VENV)
	$(AG2_VENV)/bin/python -m pip install --quiet -r corpus/requirements-ag2.txt
	@touch $@

.PHONY: framework-corpus eval-frameworks eval-compare

# One process per run set: instrumentors patch frameworks globally.
framework-corpus: $(FW_VENV)/.installed $(CREWAI_VENV)/.installed $(ADK_VENV)/.installed $(STRANDS_VENV)/.installed \
		$(AF_VENV)/.installed $(AG2_VENV)/.installed
	@for set in $(FW_RUN_SETS); do \
		HF_HUB_OFFLINE=1 $(FW_VENV)/bin/python -m corpus.generate $$set || exit 1; \
	done
	HF_HUB_OFFLINE=1 $(CREWAI_VENV)/bin/python -m corpus.generate crewai
	HF_HUB_OFFLINE=1 $(ADK_VENV)/bin/python -m corpus.generate adk
	HF_HUB_OFFLINE=1 $(ADK_VENV)/bin/python -m corpus.generate adk-content
	HF_HUB_OFFLINE=1 $(STRANDS_VENV)/bin/python -m corpus.generate strands
	HF_HUB_OFFLINE=1 $(STRANDS_VENV)/bin/python -m corpus.generate strands-content
	HF_HUB_OFFLINE=1 $(AF_VENV)/bin/python -m corpus.generate agent-framework
	HF_HUB_OFFLINE=1 $(AF_VENV)/bin/python -m corpus.generate agent-framework-content
	HF_HUB_OFFLINE=1 $(AG2_VENV)/bin/python -m corpus.generate ag2

# Ingest the corpus through a real `driftscope serve`, score every detector, write docs/detection-quality.md.
eval-frameworks: dev
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.eval_frameworks --notes corpus/detection-quality-notes.md

# Compare every corpus and simulator run with its crew's healthy runs; score the first departure
# (issue 35) into its section of docs/detection-quality.md.
eval-compare: dev
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.eval_compare
