# make demo : create .venv, install ctxlock, render the seed request on the embedded default model
# make test : create .venv with the test extras, fetch the pinned real artifacts, run the whole suite
PYTHON ?= python3.11
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip

.PHONY: demo test lint install install-test fetch chromium bench-tools clean

# pip's output goes to $(VENV)/install.log, shown only when the install fails: the demo prints only the demo.
$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python >= 3.11) on PATH"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@{ $(PIP) install --upgrade pip && $(PIP) install -e . ; } > $(VENV)/install.log 2>&1 \
		|| { cat $(VENV)/install.log; echo "pip install failed; its log is $(VENV)/install.log"; exit 1; }
	@touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	# torch==2.13.0 is pinned so pip takes the CPU build, not a multi-GB CUDA one.
	$(PIP) install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	@$(VENV)/bin/ctxlock render examples/seed-sky-injection.json

fetch: $(VENV)/.installed-test
	$(PY) scripts/fetch_artifacts.py

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check src tests scripts benchmarks
	$(VENV)/bin/ruff format --check src tests scripts benchmarks
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check --select SLF001 src

# The viewer's browser test uses Debian's chromium (Playwright's own browser download is not reachable) and a CJK
# font for the seed's Chinese text.
chromium:
	@dpkg -s chromium fonts-wqy-zenhei >/dev/null 2>&1 || apt-get install -y chromium fonts-wqy-zenhei \
		|| { apt-get update && apt-get install -y chromium fonts-wqy-zenhei; } \
		|| sudo apt-get install -y chromium fonts-wqy-zenhei

# benchmarks/bench_serve.py's load client: Debian's wrk (one C thread, a few percent of a core at these rates).
bench-tools:
	@command -v wrk >/dev/null 2>&1 || apt-get install -y wrk || { apt-get update && apt-get install -y wrk; } \
		|| sudo apt-get install -y wrk

test: $(VENV)/.installed-test fetch chromium
	$(VENV)/bin/ruff check src tests scripts benchmarks
	$(VENV)/bin/ruff format --check src tests scripts benchmarks
	# The layers (pyproject.toml [tool.importlinter]) and no reads of another module's private attributes.
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check --select SLF001 src
	$(PY) -m pytest -q
	# The conformance, injection and mistral-common suites again with every fast path off (the reference path).
	CTXLOCK_FAST=0 $(PY) -m pytest -q -p no:cacheprovider tests/test_conformance.py tests/test_injection.py \
		tests/test_mistral_parity.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
