# Quick start: `make demo` and `make test`. Both create .venv if missing and
# install the package into it; a second run reuses it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all bench install clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (or make PYTHON=/path/to/python3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel

# Reinstalls when setup.py changes.
$(STAMP): $(BIN)/python setup.py
	@echo "installing beam-prep and its dependencies into $(VENV) (first time: a few minutes)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m pipelines.demo --workdir out/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

# Also the long load tests (10x data, 1000 training steps).
test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m "" tests

bench: $(STAMP)
	$(BIN)/python -m benchmarks --quick --json out/bench.json --plot out/bench_input.png

clean:
	rm -rf out .pytest_cache
