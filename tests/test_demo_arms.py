"""`make demo` (the README's first command) asks `kvaudit run` for arms it accepts, on every backend and
for the repairs sweep: checked without a model, so a new arm that `kvaudit run` refuses by default (the
serving-change arms need --engines) cannot break the demo unnoticed (it did once)."""

from __future__ import annotations

import argparse

import pytest

from kvaudit.core.arms import REPAIR_SWEEP, SERVING_CHANGE_ARMS
from kvaudit.demo import demo_arms
from kvaudit.runners import run_cli
from kvaudit.runners.registry import BACKENDS
from kvaudit.stages import run as run_stage


@pytest.mark.parametrize("backend, arms", [*((b, demo_arms(b)) for b in BACKENDS), ("transformers", ",".join(REPAIR_SWEEP))])
def test_the_demo_asks_run_for_arms_it_accepts(backend, arms):
    p = argparse.ArgumentParser()
    run_stage.add_arguments(p)
    args = p.parse_args(["--dataset", "DS", "--out", "RUN", "--arms", arms, "--model", "smollm2", "--backend", backend])
    chosen, engines = run_cli.prepare(args)
    assert engines is None and "recompute" in chosen
    assert not set(chosen) & set(SERVING_CHANGE_ARMS)
