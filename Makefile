# make demo : create .venv, install ctxlock, render the seed request on the embedded default model
# make test : create .venv with the test extras, fetch the pinned real artifacts, run the whole suite
# make help : every target, one line each (the `## ` comments below)
PYTHON ?= python3.11
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip

.PHONY: help demo test check lint typecheck docs lock install install-test fetch chromium llama-server bench-tools clean

# pip's output goes to $(VENV)/install.log, shown only when the install fails: the demo prints only the demo.
$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python >= 3.11) on PATH"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@{ $(PIP) install --upgrade pip && $(PIP) install -e . ; } > $(VENV)/install.log 2>&1 \
		|| { cat $(VENV)/install.log; echo "pip install failed; its log is $(VENV)/install.log"; exit 1; }
	@touch $@

# The test environment is locked: requirements-test.lock pins every package `make test` runs with (`make lock`
# writes it from a working environment); torch's pin there is the CPU build, not a multi-GB CUDA one.
$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml requirements-test.lock
	$(PIP) install -q -c requirements-test.lock -e '.[test]'
	touch $@

help: ## this list
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  make \1\t\2/' | expand -t 22

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed ## install ctxlock in .venv and render the seed request on the embedded default model
	@$(VENV)/bin/ctxlock render examples/seed-sky-injection.json

fetch: $(VENV)/.installed-test ## fetch the pinned real artifacts (GGUF vocabularies, templates) into the test cache
	$(PY) scripts/fetch_artifacts.py

lint: $(VENV)/.installed-test ## ruff, the format check, the package layers and the private-attribute rule
	$(VENV)/bin/ruff check src tests scripts benchmarks conftest.py docs/_hooks.py
	$(VENV)/bin/ruff format --check src tests scripts benchmarks conftest.py docs/_hooks.py
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check --select SLF001 src

# The viewer's browser test uses Debian's chromium (Playwright's own browser download is not reachable) and a CJK
# font for the seed's Chinese text.
chromium: ## Debian's chromium and a CJK font, for the record viewer's browser test
	@dpkg -s chromium fonts-wqy-zenhei >/dev/null 2>&1 || apt-get install -y chromium fonts-wqy-zenhei \
		|| { apt-get update && apt-get install -y chromium fonts-wqy-zenhei; } \
		|| sudo apt-get install -y chromium fonts-wqy-zenhei

# The live-probe tests run llama.cpp's own llama-server, built once per test cache from the llama.cpp sources vendored
# in the pinned llama-cpp-python sdist (tests/llama_server.py; docs/testing.md has the flags and the time: about 4
# minutes on 2 free cores, once). It needs cmake, Ninja and a C++17 compiler (Debian's packages if missing).
llama-server: $(VENV)/.installed-test ## build llama.cpp's llama-server (once per test cache) for the live-probe tests
	@{ command -v cmake && command -v ninja && command -v c++; } >/dev/null 2>&1 \
		|| apt-get install -y cmake ninja-build g++ || { apt-get update && apt-get install -y cmake ninja-build g++; } \
		|| sudo apt-get install -y cmake ninja-build g++
	$(PY) scripts/build_llama_server.py

# benchmarks/bench_serve.py's load client: Debian's wrk (one C thread, a few percent of a core at these rates).
bench-tools: ## wrk, the load client of benchmarks/bench_serve.py
	@command -v wrk >/dev/null 2>&1 || apt-get install -y wrk || { apt-get update && apt-get install -y wrk; } \
		|| sudo apt-get install -y wrk

test: $(VENV)/.installed-test fetch chromium llama-server ## everything CI runs: lint, layers, the whole suite, the reference-path suite
	$(VENV)/bin/ruff check src tests scripts benchmarks conftest.py docs/_hooks.py
	$(VENV)/bin/ruff format --check src tests scripts benchmarks conftest.py docs/_hooks.py
	# The layers (pyproject.toml [tool.importlinter]) and no reads of another module's private attributes.
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check --select SLF001 src
	$(VENV)/bin/mypy
	$(MAKE) --no-print-directory docs
	# ctxlock's bytecode and the test helpers', written once: with PYTHONDONTWRITEBYTECODE set (as on this project's
	# machines) every process the suite starts would compile ctxlock again (0.1 to 0.2 s each, hundreds of processes),
	# and each test process the test helpers (tests/conftest.py has pytest keep the test modules'). Git ignores them.
	$(PY) -m compileall -q -j 2 src tests scripts
	# The whole suite (tests/, and every example of README.md and docs/) on both cores; a test file stays on one.
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=30
	# The conformance, injection and mistral-common suites again with every fast path off (the reference path).
	CTXLOCK_FAST=0 $(PY) -m pytest -q -n 2 --dist loadfile --durations=30 -p no:cacheprovider tests/template/test_conformance.py \
		tests/template/test_injection.py tests/template/test_mistral_parity.py

# The inner loop: lint, layers and the fast tier of the suite (the files in tests/fast_tier.txt, collected alone:
# collecting the whole suite costs about a minute), in about 3 minutes on 2 cores. `make test` still runs everything.
check: $(VENV)/.installed-test fetch ## the inner loop: lint, layers and the fast tier of the suite (about 3 minutes)
	$(VENV)/bin/ruff check src tests scripts benchmarks conftest.py docs/_hooks.py
	$(VENV)/bin/ruff format --check src tests scripts benchmarks conftest.py docs/_hooks.py
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy
	HYPOTHESIS_PROFILE=dev $(PY) -m pytest -q -x -p no:cacheprovider -n 2 --dist loadfile \
		$(addprefix tests/,$(shell cat tests/fast_tier.txt))

typecheck: $(VENV)/.installed-test ## mypy on src/ (the pipeline packages with the strict flags; [tool.mypy])
	$(VENV)/bin/mypy

# The site: mkdocs-material, the reference pages generated by docs/_hooks.py; strict, so a broken link or anchor fails.
docs: $(VENV)/.installed-test ## build the docs site into build/site (mkdocs --strict)
	NO_MKDOCS_2_WARNING=1 PYTHONPATH=src $(VENV)/bin/mkdocs build --strict --quiet

lock: $(VENV)/.installed-test ## write requirements-test.lock from this environment (after changing a pin)
	$(PIP) freeze --exclude-editable | LC_ALL=C sort > requirements-test.lock

clean: ## remove .venv and build outputs
	rm -rf $(VENV) build *.egg-info src/*.egg-info
