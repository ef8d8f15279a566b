# maxfx developer entry points. `make demo` and `make test` set everything up.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Find a working Python 3.12: PATH first, then pyenv (see .ci/find_python312.sh).
PYTHON312 := $(shell bash .ci/find_python312.sh)

.PHONY: demo test test-all bench sm90-report docs notebooks notebooks-refresh venv clean

$(STAMP): pyproject.toml
	@if [ ! -x "$(PY)" ]; then \
	  if [ -z "$(PYTHON312)" ]; then \
	    echo "error: Python 3.12 not found. Install it (e.g. 'pyenv install 3.12' or your OS package python3.12) and retry." >&2; exit 1; \
	  fi; \
	  "$(PYTHON312)" -m venv $(VENV) || exit 1; \
	fi
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m custom_calls.cpu
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m maxfx.demo

test: $(STAMP)
	@$(PY) -m pytest -n $${PYTEST_WORKERS:-2} -m "not slow and not gpu" --durations=15 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; fi; exit $$rc

test-all: $(STAMP)
	$(PY) -m pytest -n $${PYTEST_WORKERS:-2} tests

bench: $(STAMP)
	@for f in tests/bench/[!_]*.py; do m=$$(echo $${f%.py} | tr / .); echo "== $$m"; $(PY) -m $$m || exit 1; done

# Offline H100 compile report of every Pallas kernel (shared memory, registers, spills, wgmma), no GPU needed.
# Triton (~1 GB) goes into its own venv so the project venv stays small.
TRITON_VENV := .venv-triton
sm90-report: $(STAMP)
	@if [ ! -x "$(TRITON_VENV)/bin/python" ]; then \
	  "$(PYTHON312)" -m venv $(TRITON_VENV) && $(TRITON_VENV)/bin/pip install --quiet triton==3.9.0 || exit 1; \
	fi
	$(PY) -m tests.bench.sm90_report --triton-python $(TRITON_VENV)/bin/python

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict -f docs/mkdocs.yml

# JupyterLab (dev extra, with ipywidgets) on notebooks/; kernels start in notebooks/ and use this venv's Python.
notebooks: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

# Re-execute every notebook in place from its own folder so the committed files carry their outputs (plots).
notebooks-refresh: $(STAMP)
	$(PY) notebooks/refresh.py

clean:
	rm -rf $(VENV) $(TRITON_VENV) site .pytest_cache
