"""`kvaudit plan`: false-pass rate, power and cases needed per gate threshold, for an explicit
design and for a pilot run (synthetic, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.testing.synthetic import make_run

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
        _check_planned_from_the_pilot(pilot, r, p)


def _check_planned_from_the_pilot(pilot: Path, r: dict, p: dict) -> None:
    """One threshold's plan against its group's design taken by hand from the pilot's scores, and
    the simulator run on that design with the plan's seed and reps (the same runs, so the same rates)."""
    from dataclasses import replace

    from kvaudit.reports.analysis import Analysis, load_run
    from kvaudit.stats import calibration as cal

    an = Analysis(load_run(pilot))
    ids = list(an.select(r["group"]))
    ref = [an.rows[(c, "recompute")]["score"] for c in ids]
    arm = [an.rows[(c, p["arm"])]["score"] for c in ids]
    docs = [set(an.rows[(c, "recompute")]["documents"]) for c in ids]
    n, base = len(ids), sum(ref) / len(ids)
    multi = sum(len(d) >= 2 for d in docs) / n
    churn = sum(a != b for a, b in zip(ref, arm)) / n
    hetero = 0.8  # the default: a pilot cannot estimate it
    d = r["design"]
    assert (r["cases"], d["n"], d["heterogeneity"]) == (n, n, hetero)
    assert d["base_accuracy"] == pytest.approx(base) and d["multi_doc_share"] == pytest.approx(multi)
    assert d["gain_rate"] == pytest.approx(min(churn / (2 * (1 - base)), 1 / (1 + hetero)))
    assert d["n_documents"] == len(set().union(*docs))
    assert d["cluster_size"] == pytest.approx(max(1.0, n * (1 + multi) / d["n_documents"]))
    assert d["score"] == ("binary" if set(ref + arm) <= {0.0, 1.0} else "f1")
    assert d["fragile_share"] == cal.Design.fragile_share

    design = cal.Design(**{k: v for k, v in d.items() if k != "n_documents"})  # the values checked above

    def gate(diffs, members, confidence):  # the policy's bound
        return cal.new_gate(diffs, members, confidence, min_icc=p["min_icc"])

    margin = r["margin_points"] / 100
    kw = {"reps": p["reps"], "seed": p["seed"], "confidence": p["confidence"], "statistic": gate}
    c = cal.characterise(design, margin, **kw)
    assert r["false_pass"] == c.at_margin.passed and r["power"] == c.at_zero.passed  # true delta = margin; = 0
    assert r["false_pass_se"] == pytest.approx(cal.mc_se(c.at_margin.passed, p["reps"]))
    # the cases for 80% power: the gate passes a true delta of 0 that often there, not at half of it,
    # and more than the pilot's cases exactly when the pilot's size falls short
    needed = r["cases_for_80_power"]

    def power(cases: int) -> float:
        return cal.rates(replace(design, n=cases), 0.0, margin, **kw).passed

    assert power(needed) >= 0.8 > power(needed // 2)
    assert (needed > n) == (r["power"] < 0.8)


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
