# Quick start: `make demo` and `make test`. Both create .venv if missing and
# install the package into it; a second run reuses it.
# The first of python3.11, python3.12, python3.13 that runs (or PYTHON=...).
PYTHON ?= $(firstword $(foreach p,python3.11 python3.12 python3.13,$(shell $(p) -c "" >/dev/null 2>&1 && echo $(p))))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint bench install label-studio clean

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "need python3.11, python3.12 or python3.13 on PATH (or make PYTHON=/path/to/python3)"; exit 1; }
	@$(PYTHON) -c "import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 13), sys.version" || { echo "$(PYTHON) is not Python 3.11-3.13"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel

# Bytecode: pip compiles none at install (half the install's time, mostly
# for modules never imported); Python writes the .pyc of what is imported on
# first use, under $(VENV)/pycache, even where PYTHONDONTWRITEBYTECODE is set
# (the suite's many processes each import TensorFlow: 3x slower uncached).
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache
unexport PYTHONDONTWRITEBYTECODE
# Imported once after the install, TensorFlow beside the rest (2 cores):
# every later process, the suite's first ones too, finds them compiled.
WARM_FIRST := apache_beam, pandas, scipy, PIL, flask, waitress, selenium
WARM_THEN := tensorflow_transform, pipelines.cli, train.cli, train.serve.app, train.fit.loop, train.export.saved_model, benchmarks.run

# Reinstalls when setup.py changes.
$(STAMP): $(BIN)/python setup.py
	@echo "installing beam-prep and its dependencies into $(VENV) (first time: a few minutes)"
	$(BIN)/python -m pip install --quiet --no-compile -e ".[all,test]"
	@echo "writing the .pyc of what the commands import (once)"
	@($(BIN)/python -c "import tensorflow, keras" & $(BIN)/python -c "import $(WARM_FIRST)"; wait) 2>/dev/null || true
	@$(BIN)/python -c "import $(WARM_THEN)" 2>/dev/null || true
	@# Label Studio's SDK for its brush RLE decoder only (numpy and PIL): its own
	@# pins (numpy < 2.3, 30 packages) are not ours, so without its dependencies.
	$(BIN)/python -m pip install --quiet --no-compile --no-deps label-studio-sdk==2.1.2
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m pipelines.demo --workdir out/demo

# One test worker per core (at most 4: each holds TensorFlow and Beam);
# `worksteal` hands a long test's neighbours to an idle worker; the 10
# slowest tests are listed at the end.
PYTEST := $(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist worksteal --durations=10

test: $(STAMP) label-studio
	$(PYTEST) tests

# Label Studio for the test that drives a real one, in an environment of its
# own under ~/.cache (tests/label_studio_env.py): installed once per machine
# (about 2 minutes and 1 GB); where it cannot be, that test says why and is
# skipped.
label-studio: $(BIN)/python
	@$(BIN)/python tests/label_studio_env.py install

# ruff's lint and format checks (settings in pyproject.toml); `ruff format .`
# fixes the format.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Also the long load tests (10x data, 1000 training steps).
test-all: $(STAMP) label-studio
	$(PYTEST) -m "" tests

bench: $(STAMP)
	$(BIN)/python -m benchmarks --quick --json out/bench.json --plot out/bench_input.png

clean:
	rm -rf out .pytest_cache
