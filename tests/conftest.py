"""Shared fixtures, and every test's cost in one table.

Tests are marked by what they cost (the markers are registered in pyproject.toml):

- ``engine``: loads a real model (SmolLM2 through transformers, vLLM's engine, the GGUF
  conversion), in this process or in a child ``kvaudit`` process;
- ``server``: starts a server process (``vllm serve``, ``llama-server``);
- ``calibration``: simulates a statistical decision's operating characteristic (a fast slice of a
  benchmark);
- ``browser``: drives headless Chromium;
- ``vllm``: needs vLLM importable, so runs in ``.venv-vllm`` (``make test``'s second step); every
  other test runs in ``.venv``, and each test runs in exactly one of them.

The fast tier is ``pytest -m "not engine and not server"``. The marks come from :data:`COSTS`
(by module, or by ``module::test``) and :data:`FIXTURE_COSTS` (a test that uses a fixture costs
what the fixture costs), never from decorators in the modules, so a new test that uses a
real-model fixture cannot be left out of its tier. A test outside the engine tier that loads a
model in this process fails, naming this table (:func:`_engine_guard`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    """``benchmarks/NAME.py`` as a module (the tests run fast slices of its simulations)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


EXAMPLE = ROOT / "kvaudit" / "data" / "example"
ALL_ARMS = "recompute,reuse,identity,reuse_norope,recompute_again,reuse_first_user"

# What a test costs, by module (all its tests) or by "module::test" (that test, every parameter).
COSTS: dict[str, set[str]] = {
    # vLLM: the engine in this process, a `vllm serve`, or kvaudit in a child process on vLLM
    "test_vllm": {"vllm"},
    "test_gpu_paged_kv": {"vllm"},
    "test_connector_resumed": {"vllm"},
    "test_backend_contract": {"vllm"},
    "test_http_backend": {"vllm", "server", "engine"},
    "test_http_prefix_server": {"vllm", "server"},
    "test_replay_vllm": {"vllm", "engine"},
    "test_vllm_preemption": {"vllm", "engine"},
    # upstream llama.cpp's llama-server (built by `make test-engines`; skipped where it is not)
    "test_llama_cpp": {"server"},
    # SmolLM2 in a child kvaudit process, or converted
    "test_models::test_smollm2_is_converted_once_into_a_plain_checkpoint": {"engine"},
    "test_sequential::test_a_sequential_run_stops_when_decided_and_the_gate_reads_its_design": {"engine"},
    "test_replay::test_segment_replay_is_held_to_the_simulator_and_resumes_without_loss": {"engine"},
    "test_replay::test_a_killed_replay_resumes_without_losing_or_repeating_a_request": {"engine"},
    "test_replay::test_a_log_kept_with_its_text_is_replayed_with_that_text": {"engine"},
    "test_replay::test_an_open_loop_replay_counts_the_wait_in_ttft": {"engine"},
    "test_replay::test_a_request_longer_than_the_model_is_refused_before_any_is_served": {"engine"},
    "test_replay::test_a_serving_change_replayed_on_each_engine_is_named_side_by_side": {"engine"},
    "test_preflight::test_a_case_longer_than_the_model_is_refused_before_the_first_case": {"engine"},
    "test_preflight::test_a_segment_replay_whose_wave_overflows_the_budget_is_refused_before_any_request":
        {"engine"},
    "test_serving_change::test_an_undeclared_difference_fails_the_audit_naming_it": {"engine"},
    "test_serving_change_vllm": {"vllm", "engine"},
    "test_serving_change_vllm::test_two_servers_are_compared_by_what_they_report": {"server"},
    # simulations of a decision's operating characteristic
    "test_gate_calibration": {"calibration"},
    "test_timing_stats": {"calibration"},
    "test_speed::test_false_pass_at_the_threshold_is_within_alpha_half": {"calibration"},
    "test_speed::test_the_slice_fails_when_the_interval_is_dropped": {"calibration"},
    "test_sequential::test_sequential_gate_is_calibrated_and_stops_early_fast_slice": {"calibration"},
    "test_sequential::test_futility_only_removes_passes_and_stops_losses_sooner": {"calibration"},
    "test_replay::test_percentile_intervals_cover_at_the_stated_level": {"calibration"},
    "test_report_browser": {"browser"},
}

# Fixtures that cost something: a test that uses one (directly or through another) costs it too.
FIXTURE_COSTS: dict[str, set[str]] = {
    "smollm2_backend": {"engine"}, "smollm2_run": {"engine"}, "run_copy": {"engine"},
    "vllm_backend": {"engine", "vllm"}, "vllm_run": {"engine", "vllm"}, "kvaudit_process": {"vllm"}, "vllm_prewarmed": {"vllm"},
    "connector_server": {"server", "vllm"}, "stock_server": {"server", "vllm"},
    "contract_runs": {"engine"}, "transformers_run": {"engine"}, "change_run": {"engine"},
}
MARKERS = ("engine", "server", "calibration", "browser", "vllm")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def costs_of(item: pytest.Item) -> set[str]:
    """The markers ``item`` gets from :data:`COSTS` and :data:`FIXTURE_COSTS`."""
    module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""
    name = getattr(item, "originalname", item.name)
    out = set(COSTS.get(module, ())) | set(COSTS.get(f"{module}::{name}", ()))
    for fixture in getattr(item, "fixturenames", ()):
        out |= FIXTURE_COSTS.get(fixture, set())
    return out


def _stale_costs() -> list[str]:
    """Entries of COSTS naming a module or test that does not exist (a rename would lose its marks)."""
    import re

    stale = []
    for key in COSTS:
        module, _, test = key.partition("::")
        path = Path(__file__).parent / f"{module}.py"
        if not path.exists() or (test and not re.search(rf"^def {re.escape(test)}\(", path.read_text(), re.M)):
            stale.append(key)
    return stale


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stale = _stale_costs()
    if stale:
        raise pytest.UsageError(f"tests/conftest.py COSTS names tests that do not exist: {stale}")
    for item in items:
        for marker in sorted(costs_of(item)):
            item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(autouse=True)
def _engine_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside the engine tier, loading a real model in this process is an error naming the table."""
    if request.node.get_closest_marker("engine"):
        return
    import kvaudit.models

    def refuse(model: str = kvaudit.models.DEFAULT_MODEL, *args, **kwargs):
        kvaudit.models.resolve_model_dir(model)  # a model that is not there: the test's own error
        raise AssertionError(f"{request.node.nodeid} loads a real model but is not in the engine tier: "
                             "add it to COSTS in tests/conftest.py")

    monkeypatch.setattr(kvaudit.models, "load_model", refuse)


@pytest.fixture(scope="session")
def smollm2_backend():
    """The real default model (converted once into $KVAUDIT_CACHE), fp32 on CPU."""
    from kvaudit.runners.engines.transformers.backend import open_backend

    return open_backend("smollm2", max_new_tokens=8)


@pytest.fixture(scope="session")
def smollm2_run(smollm2_backend, tmp_path_factory) -> Path:
    """A real run of the example dataset under every arm; copy it before tampering."""
    from kvaudit.core.arms import parse_arms
    from kvaudit.core.dataset_format import read_dataset
    from kvaudit.runners.runner import RunConfig, execute

    out = tmp_path_factory.mktemp("smollm2_run") / "run"
    cfg = RunConfig(dataset=read_dataset(EXAMPLE), out=out, arms=parse_arms(ALL_ARMS), model_name="smollm2")
    execute(cfg, smollm2_backend, progress=False)
    return out


@pytest.fixture
def run_copy(smollm2_run, tmp_path) -> Path:
    """A private copy of the real run that a test may tamper with."""
    dst = tmp_path / "run"
    shutil.copytree(smollm2_run, dst)
    return dst


# ----------------------------------------------------------------------------- vLLM tier (.venv-vllm)

# Short documents (30-60 words): on the CPU a request's time is mostly its prefill, so the tier's
# time follows the prompt length; prompts stay past one 128-token block (the stock server's).
BOXOFFICE5 = ["--cases", "5", "--seed", "3", "--families", "single_doc=2,multi_hop_bridge=1,leak_probe=1",
              "--min-words", "30", "--max-words", "60"]


@pytest.fixture(scope="session")
def boxoffice5(tmp_path_factory) -> Path:
    """Five Boxoffice cases (single-document, two-hop, a leak probe; prompts of about 200 tokens):
    the vLLM tier's one dataset."""
    from kvaudit.cli import main

    out = tmp_path_factory.mktemp("boxoffice5") / "dataset"
    assert main(["generate", "boxoffice", "--out", str(out), *BOXOFFICE5, "--no-progress"]) == 0
    return out


@pytest.fixture(scope="session")
def vllm_prewarmed():
    """A parent that imported vLLM once for the session (kvaudit/testing/prewarmed.py): its ``run``
    forks a ``kvaudit`` command, its ``run_script`` a Python script, each a new process with its
    own engine, about 12 s sooner than a fresh interpreter here."""
    from kvaudit.testing.prewarmed import Prewarmed

    with Prewarmed() as p:
        yield p


@pytest.fixture(scope="session")
def kvaudit_process(vllm_prewarmed):
    """Runs ``python -m kvaudit.cli ARGV`` as a new process (its own engine, exit code and output),
    forked from the prewarmed parent. Returns a ``subprocess.CompletedProcess`` with text output."""
    return vllm_prewarmed.run


@pytest.fixture(scope="session")
def vllm_backend():
    """One in-process vLLM engine (SmolLM2, fp32, eager) for the session; closed at its end."""
    from kvaudit.runners.engines.vllm.backend import open_vllm_backend

    b = open_vllm_backend("smollm2", max_new_tokens=8, kv_cache_bytes=768 << 20, max_model_len=4096)
    yield b
    b.close()


VLLM_RUN_ARMS = "recompute,reuse,identity,prefix_cache,recompute_again"


@pytest.fixture(scope="session")
def vllm_run(vllm_backend, boxoffice5, tmp_path_factory) -> Path:
    """The five cases on the in-process engine under VLLM_RUN_ARMS, run first on a fresh engine."""
    from kvaudit.core.dataset_format import read_dataset
    from kvaudit.runners.registry import arms_for
    from kvaudit.runners.runner import RunConfig, execute

    out = tmp_path_factory.mktemp("vllm_run") / "run"
    execute(RunConfig(dataset=read_dataset(boxoffice5), out=out, arms=arms_for(VLLM_RUN_ARMS, "vllm"),
                      model_name="smollm2"), vllm_backend, progress=False)
    return out


CONTRACT_ARMS = "recompute,reuse,identity,recompute_again"
CONTRACT_CASES = 2


def contract_run_args(backend: str, dataset: Path, out: Path) -> list[str]:
    """`kvaudit run` as the backend contract runs it, on the first CONTRACT_CASES cases. The prompt
    limit is part of the configuration (records' truncation.max_tokens): vLLM's is its
    max_model_len, transformers' the model's 8192 positions; same limit, same truncation decision."""
    limit = ["--max-model-len", "8192"] if backend == "vllm" else []
    return ["run", "--backend", backend, "--dataset", str(dataset), "--out", str(out), "--arms", CONTRACT_ARMS,
            "--limit", str(CONTRACT_CASES), "--max-new-tokens", "8", "--no-progress", *limit]


@pytest.fixture(scope="session")
def transformers_run(boxoffice5, tmp_path_factory) -> Path:
    """The transformers backend's `kvaudit run` of the shared cases: the backend contract's
    reference, and the other side of the report's cross-backend table."""
    from kvaudit.cli import main

    out = tmp_path_factory.mktemp("transformers_run") / "run"
    assert main(contract_run_args("transformers", boxoffice5, out)) == 0
    return out


@pytest.fixture(scope="session")
def connector_server(tmp_path_factory):
    """``vllm serve`` with kvaudit's segment connector, for the session."""
    from kvaudit.models import resolve_model_dir
    from kvaudit.testing.vllm_server import vllm_server

    with vllm_server(resolve_model_dir("smollm2"), tmp_path_factory.mktemp("serve") / "vllm-serve.log",
                     connector=True) as url:
        yield url


@pytest.fixture(scope="session")
def stock_server(tmp_path_factory):
    """Stock ``vllm serve`` with prefix caching at the engine's default block (128 tokens on the
    CPU), as a team runs it, for the session."""
    from kvaudit.models import resolve_model_dir
    from kvaudit.testing.vllm_server import vllm_server

    with vllm_server(resolve_model_dir("smollm2"), tmp_path_factory.mktemp("serve") / "vllm-serve.log",
                     connector=False, block_size=None) as url:
        yield url
