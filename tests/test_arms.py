"""Arm selection: required companions, canonical order, and arms a backend cannot run."""

from __future__ import annotations

import importlib.util

import pytest

from kvaudit.cli import main
from kvaudit.core.arms import ARMS, CANONICAL_ORDER
from kvaudit.core.errors import KvauditError
from kvaudit.runners.registry import arms_for

from .conftest import EXAMPLE


def test_every_arm_has_a_place_in_the_canonical_order():
    assert set(CANONICAL_ORDER) == set(ARMS)
    assert CANONICAL_ORDER[0] == "recompute" and CANONICAL_ORDER[-1] == "recompute_again"


def test_prefix_cache_brings_its_cold_run_first():
    assert arms_for("prefix_cache,reuse", "vllm") == ["recompute", "reuse", "prefix_cache_cold", "prefix_cache"]


def test_engine_arms_are_refused_on_transformers():
    with pytest.raises(KvauditError, match="needs --backend vllm"):
        arms_for("reuse,prefix_cache", "transformers")
    with pytest.raises(KvauditError, match="unknown arm 'prefix'"):
        arms_for("prefix", "vllm")


def test_run_cli_refuses_an_engine_arm_before_loading_a_model(tmp_path, capsys):
    code = main(["run", "--dataset", str(EXAMPLE), "--out", str(tmp_path / "run"), "--arms", "prefix_cache"])
    assert code == 2
    assert "needs --backend vllm" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_run_cli_without_vllm_installed_names_the_setup_command(tmp_path, capsys):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    code = main(["run", "--backend", "vllm", "--dataset", str(EXAMPLE), "--out", str(tmp_path / "run")])
    assert code == 2
    assert "make setup-vllm" in capsys.readouterr().err


def test_report_explains_every_arm_even_without_manifest_reasons():
    from kvaudit.reports.analysis import arm_reason

    for name in ARMS:
        assert arm_reason(name), name
    assert arm_reason("prefix_cache") == ARMS["prefix_cache"].why


def test_in_a_group_the_arm_that_resets_the_engine_cache_runs_after_the_others():
    from kvaudit.runners.runner import _arm_order

    arms = arms_for("recompute,prefix_cache_cold,prefix_cache_flushed,prefix_cache,prefix_cache_other_tenant,"
                      "recompute_again", "openai")
    assert _arm_order(arms, 1) == arms  # one case at a time: as given
    grouped = _arm_order(arms, 3)
    assert grouped[-1] == "prefix_cache_flushed" and sorted(grouped) == sorted(arms)
    assert grouped.index("prefix_cache_cold") < grouped.index("prefix_cache")  # warm still right after cold
    assert [a for a in ARMS if ARMS[a].resets_engine_cache] == ["prefix_cache_flushed"]


def test_backends_declare_the_engine_arms_they_run():
    from kvaudit.core.arms import get_arm
    from kvaudit.runners.registry import BACKENDS, check_arms_run_on

    for spec in ARMS.values():
        runners = [b.name for b in BACKENDS.values() if b.runs(spec)]
        assert runners == list(BACKENDS) if spec.portable else runners, spec.name
    assert [b.name for b in BACKENDS.values() if b.runs(get_arm("prefix_cache"))] == ["vllm", "openai"]
    assert [b.name for b in BACKENDS.values() if b.runs(get_arm("epic@16"))] == ["transformers"]
    check_arms_run_on(["recompute", "reuse"], "a-backend-outside-the-registry")
    with pytest.raises(KvauditError, match="needs --backend vllm or openai"):
        check_arms_run_on(["prefix_cache"], "a-backend-outside-the-registry")


def test_an_arm_copied_with_its_role_is_refused_by_name(monkeypatch):
    """The code asks for arms by role: two arms of one role must fail loudly, naming both."""
    import dataclasses

    from kvaudit.core import arms

    copy = dataclasses.replace(arms.ARMS["reuse"], name="reuse_again")
    monkeypatch.setitem(arms.ARMS, "reuse_again", copy)
    with pytest.raises(ValueError, match=r"'under_test' must belong to exactly one arm.*reuse_again"):
        arms.arm_for("under_test")
    monkeypatch.setitem(arms.ARMS, "reuse_again", dataclasses.replace(copy, role="no_such_role"))
    with pytest.raises(ValueError, match="has no line in ROLES"):
        arms._check_registry()
