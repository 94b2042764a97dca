"""`kvaudit plan`: false-pass rate, power and cases needed per gate threshold, for an explicit
design and for a pilot run (synthetic, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.reports.synthetic import make_run

FAST = ["--reps", "40"]


@pytest.fixture(scope="module")
def pilot(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("plan") / "pilot", n_per_task=20, seed=1)


def test_plan_from_a_pilot_run(pilot: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", "--from", str(pilot), "--json", str(out), *FAST]) == 0
    text = capsys.readouterr().out
    assert "overall quality" in text and "multi-hop quality" in text
    assert "false-pass rate at the margin" in text and "cases for 80% power" in text
    p = json.loads(out.read_text())
    assert p["confidence"] == 0.95 and p["one_sided_level"] == 0.975 and p["reps"] == 40
    overall, multi = p["thresholds"]
    assert (overall["group"], overall["margin_points"]) == ("overall", -2.0)
    assert (multi["group"], multi["margin_points"]) == ("task:multi_hop_*", -5.0)
    # overall = the scorable non-agreement cases (single_doc, multi_hop_bridge, aggregate)
    assert overall["cases"] == 60 and multi["cases"] == 20
    assert multi["design"]["multi_doc_share"] > 0.5 and multi["design"]["score"] == "binary"
    assert overall["design"]["score"] in ("binary", "f1") and overall["design"]["n_documents"] <= 12
    for r in (overall, multi):
        assert 0 <= r["false_pass"] <= 1 and 0 <= r["power"] <= 1 and r["false_pass_se"] >= 0
        assert r["cases_for_80_power"] is None or r["cases_for_80_power"] >= 1


def test_plan_explicit_design(tmp_path: Path, capsys) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('confidence = 0.95\n[[delta]]\nname = "overall"\ngroup = "overall"\n'
                      "min_lower_bound = -5.0\n", encoding="utf-8")
    out = tmp_path / "plan.json"
    assert main(["plan", "--policy", str(policy), "--cases", "400", "--cluster-size", "2",
                 "--multi-doc-share", "0.5", "--score", "binary", "--base-accuracy", "0.7",
                 "--json", str(out), *FAST]) == 0
    assert "400 on 300 documents" in capsys.readouterr().out
    (row,) = json.loads(out.read_text())["thresholds"]
    assert row["cases"] == 400 and row["design"]["base_accuracy"] == 0.7
    assert row["false_pass"] <= 0.15 and row["power"] > 0.5  # -5 pts at 400 cases: easy
    assert row["cases_for_80_power"] <= 400
    seq = row["sequential"]  # the sequential design at the fixed design's size: fewer cases on average
    assert seq["max_cases"] == row["cases_for_80_power"]
    assert seq["clear_loss"]["mean_cases"] < seq["zero"]["mean_cases"] <= seq["max_cases"]
    assert seq["clear_loss"]["passed"] == 0.0


def test_plan_task_group_without_cases(pilot: Path, tmp_path: Path, capsys) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('[[delta]]\ngroup = "task:nothing_*"\nmin_lower_bound = -2.0\n', encoding="utf-8")
    assert main(["plan", "--policy", str(policy), "--from", str(pilot), *FAST]) == 0
    assert "cases: 0 (no cases in the pilot run)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, option", [
    (["--cases", "0"], "--cases"),
    ([], "--cases N"),
    (["--cases", "100", "--multi-doc-share", "1.5"], "--multi-doc-share"),
    (["--cases", "100", "--base-accuracy", "1"], "--base-accuracy"),
    (["--cases", "100", "--cluster-size", "0.5"], "--cluster-size"),
    (["--cases", "100", "--reps", "5"], "--reps"),
    (["--cases", "100", "--gain-rate", "0.9"], "--gain-rate"),
    (["--from", "RUN", "--cases", "100"], "--cases cannot be combined with --from"),
    (["--from", "/nonexistent/run"], "--from"),
])
def test_plan_bad_options_are_clear_errors(argv: list[str], option: str, capsys) -> None:
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvaudit: error:") and option in err and "Traceback" not in err


def test_plan_refuses_a_policy_without_thresholds(tmp_path: Path, capsys) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text("[audit]\nrequire_passed = true\n", encoding="utf-8")
    assert main(["plan", "--policy", str(policy), "--cases", "100"]) == 2
    assert "no [[delta]] thresholds" in capsys.readouterr().err


def test_plan_uses_the_policys_min_icc(tmp_path):
    """A policy that floors the design effect plans with that floor: less power, same design."""
    import argparse

    from kvaudit.reports import plan_cli

    def run_plan(policy_text: str) -> dict:
        policy = tmp_path / f"p{abs(hash(policy_text))}.toml"
        policy.write_text(policy_text)
        parser = argparse.ArgumentParser()
        plan_cli.add_arguments(parser)
        args = parser.parse_args(["--policy", str(policy), "--cases", "600", "--cluster-size", "10",
                                  "--reps", "60"])
        return plan_cli.plan(args)

    base = '[[delta]]\ngroup = "overall"\nmin_lower_bound = -5.0\n'
    plain, floored = run_plan(base), run_plan("min_icc = 0.3\n" + base)
    assert floored["min_icc"] == 0.3 and plain["min_icc"] == 0.0
    assert floored["thresholds"][0]["power"] < plain["thresholds"][0]["power"]
