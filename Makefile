# make test: a virtual environment with the package and its test extras, then the whole suite
# (lint, types, tests). make demo: llm-latency demo, scenes against a built-in loopback server.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: test demo bench lint clean

$(VENV)/.test-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(VENV)/.demo-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[cli]'
	touch $@

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest

demo: $(VENV)/.demo-installed
	$(VENV)/bin/llm-latency demo

bench: $(VENV)/.test-installed
	$(PY) bench/overhead.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
