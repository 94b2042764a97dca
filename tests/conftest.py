"""Shared fixtures: one real SmolLM2 run per session, and the model tier.

Tests come in two tiers. Most run on synthetic runs (``kvaudit.reports.synthetic.make_run``: real
records, a real audit, no model) or a tiny random model. Tests that load a real model are the
*model* tier (``@pytest.mark.model``, registered in pyproject.toml): the default suite runs them,
``pytest -m "not model"`` leaves them out. A test that uses a real-model fixture is put in the
tier here, so a new one cannot be left out of it by accident.
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


# Fixtures that load a real model: conftest's, and those of single modules (by module name).
MODEL_FIXTURES = {"smollm2_backend", "smollm2_run", "run_copy"}
MODULE_MODEL_FIXTURES = {"test_backend_contract": {"runs"}, "test_vllm": {"backend", "vllm_run"}}


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        local = MODULE_MODEL_FIXTURES.get(module.__name__.rsplit(".", 1)[-1], set()) if module else set()
        if (MODEL_FIXTURES | local) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def smollm2_backend():
    """The real default model (converted once into $KVAUDIT_CACHE), fp32 on CPU."""
    from kvaudit.runners.engines.transformers.backend import open_backend

    return open_backend("smollm2", max_new_tokens=16)


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
