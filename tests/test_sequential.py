"""The sequential gate's statistics: boundaries against published values, decisions at a look,
and a fast slice of benchmarks/sequential_calibration.py (false-pass rate at the margin, expected
sample size at delta 0 and under a clear loss)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvaudit.stats.sequential import (
    conditional_power,
    design,
    design_from_dict,
    evaluate_look,
    obf_spent,
    run_sequential,
)
from tests.conftest import load_benchmark


def test_obrien_fleming_boundaries_match_the_published_values():
    # Lan-DeMets O'Brien-Fleming, one-sided 0.025, five equally spaced looks (gsDesign sfLDOF)
    d = design(500, 100, 0.025)
    assert d.looks == (100, 200, 300, 400, 500)
    assert d.z == pytest.approx((4.8769, 3.3569, 2.6803, 2.2898, 2.0310), abs=2e-3)
    assert obf_spent(1.0, 0.025) == pytest.approx(0.025)
    # the fail rule's (Pocock-type) levels are nearly flat and never looser than the fixed level
    assert all(0.0025 < a < 0.025 for a in d.fail_nominal_alpha)


def test_a_look_passes_fails_or_continues():
    plan = design(400, 100, 0.025)
    members = [[f"d{i % 80}"] for i in range(400)]
    same = np.zeros(400)
    assert evaluate_look(same, members, -0.05, plan, 0).decision == "continue"  # first look: z 4.3 needed
    assert run_sequential(same, members, -0.05, plan).decision == "pass"
    broken = -(np.arange(400) % 2).astype(float)  # half the cases lost: decided at the first look
    res = run_sequential(broken, members, -0.05, plan)
    assert (res.decision, res.n) == ("fail", 100)
    few = [["d0"]] * 400  # one document: never decidable, and the last look fails
    res = run_sequential(same, few, -0.05, plan)
    assert res.decision == "fail" and "not decidable" in res.reason


def test_futility_only_removes_passes_and_stops_losses_sooner():
    from kvaudit.stats.calibration import Design, simulate_diffs

    with_f, without = design(400, 40, 0.025), design(400, 40, 0.025, futility=0.0)
    assert with_f.futility == 0.2 and without.futility == 0.0
    rng = np.random.default_rng(5)
    sim = Design(n=400, gain_rate=0.05)
    for delta in (0.0, -0.02, -0.10):
        n_with, n_without = [], []
        for _ in range(40):
            d, members = simulate_diffs(sim, delta, rng)
            a = run_sequential(d, members, -0.02, with_f)
            b = run_sequential(d, members, -0.02, without)
            assert a.decision != "pass" or b.decision == "pass"  # never a pass the rule without futility lacks
            assert a.n <= b.n
            n_with.append(a.n)
            n_without.append(b.n)
        if delta < 0:
            assert np.mean(n_with) < np.mean(n_without)  # at the margin and below, futility stops earlier


def test_conditional_power_follows_the_data_and_names_itself():
    plan = design(1000, 100, 0.025)
    members = [[f"d{i}"] for i in range(300)]
    fine, bad = np.zeros(300), np.zeros(300)
    bad[:30] = -1  # 10 points lost so far
    assert conditional_power(fine, 1.0, -0.02, plan) > 0.9
    assert conditional_power(bad, 1.0, -0.02, plan) < 0.01
    res = evaluate_look(np.r_[np.zeros(270), -np.ones(12), np.ones(18)], members, -0.02, plan, 2)
    assert res.decision in ("pass", "continue")
    # at 600 of 1,000 cases, 1.7 points lost so far (inside the margin, so the loss is not decided):
    # even 400 more cases with no difference leave the final bound under -2
    members = [[f"d{i}"] for i in range(600)]
    res = evaluate_look(np.r_[np.zeros(570), -np.ones(20), np.ones(10)], members, -0.02, plan, 5)
    assert res.decision == "fail" and res.reason.startswith("futile") and res.extra["conditional_power"] < 0.2
    assert res.upper > -0.02  # the fail rule alone would have gone on


def test_a_design_recorded_without_futility_keeps_running_without_it():
    old = design(500, 100, 0.025).to_dict()
    del old["futility"]
    assert design_from_dict(old).futility == 0.0
    assert design_from_dict(design(500, 100, 0.025).to_dict()).futility == 0.2
    with pytest.raises(ValueError, match="futility"):
        design_from_dict({**old, "futility": 1.5})


def test_looks_past_fifty_are_refused():
    with pytest.raises(ValueError, match="at most 50"):
        design(1000, 10, 0.025)


def test_sequential_gate_is_calibrated_and_stops_early_fast_slice():
    bench = load_benchmark("sequential_calibration")
    (row,) = bench.grid(fast=True)
    c = bench.characterise(row, reps=200, seed=3)
    assert not bench.check(row, c), c  # false pass at the margin within alpha + 3 MC SE
    assert c["zero"].mean_cases <= 0.80 * row.design.n
    assert c["loss"].mean_cases <= 0.30 * row.design.n
    assert c["margin"].mean_cases <= 0.90 * row.design.n  # futility: a reuse at the margin stops before the end
    assert c["zero"].passed >= 0.9


def _sequential_run(tmp_path, loss: float, record_edit=None, drop: int = 0):
    from kvaudit.core.run_dir import RunDir
    from kvaudit.testing.synthetic import make_pairs, make_run

    pairs = make_pairs(60, loss={"single_doc": loss, "multi_hop_bridge": loss, "leak_probe": 0.0}, n_docs=40,
                       leak_probes=0, seed=2)
    n = len(pairs)
    plan = design(n, n // 4 if n % 4 == 0 else n // 4 + 1, 0.025)
    pairs = pairs[: len(pairs) - drop]
    run = tmp_path / "run"
    make_run(run, pairs)
    d = RunDir(run)
    m = d.read_manifest()
    record = plan.to_dict()
    if record_edit:
        record_edit(record)
    m.extra["sequential"] = record
    d.write_manifest(m)
    return run, plan


POLICY = 'arm = "reuse"\nmissing = "skip"\n[[delta]]\nname = "overall"\ngroup = "overall"\nmin_lower_bound = {}\n'


@pytest.mark.parametrize("loss, margin, expected", [(0.0, -20.0, 0), (0.9, -5.0, 1)])
def test_the_gate_judges_a_sequential_run_by_its_design(tmp_path, capsys, loss, margin, expected):
    from kvaudit.cli import main

    run, plan = _sequential_run(tmp_path, loss)
    pol = tmp_path / "p.toml"
    pol.write_text(POLICY.format(margin))
    assert main(["gate", str(run), "--policy", str(pol)]) == expected
    out = capsys.readouterr().out
    assert f"look {len(plan.looks)} of {len(plan.looks)}" in out


@pytest.mark.parametrize("edit, drop, message", [
    (None, 3, "is not one of the design's looks"),  # cut between looks (or extended): judged at no look
    (lambda r: r.update(design(10, 5, 0.025).to_dict()), 0, "past the design's maximum"),  # extended
    (lambda r: r.update(looks=[1, 2]), 0, "looks do not follow"),
    (lambda r: r.update(alpha=0.2), 0, "designed at one-sided alpha 0.2"),
])
def test_a_sequential_run_off_its_design_cannot_pass(tmp_path, capsys, edit, drop, message):
    from kvaudit.cli import main

    run, _ = _sequential_run(tmp_path, 0.0, edit, drop)
    pol = tmp_path / "p.toml"
    pol.write_text(POLICY.format(-20.0))
    assert main(["gate", str(run), "--policy", str(pol)]) == 2
    assert message in capsys.readouterr().out


def test_sequential_options_need_until_decided_and_a_maximum(tmp_path, capsys):
    from kvaudit.cli import main

    example = str(Path(__file__).resolve().parents[1] / "kvaudit" / "data" / "example")
    assert main(["run", "--dataset", example, "--out", str(tmp_path / "a"), "--max-cases", "5"]) == 2
    assert "--max-cases belongs to a sequential run: add --until-decided" in capsys.readouterr().err
    assert main(["run", "--dataset", example, "--out", str(tmp_path / "b"), "--until-decided"]) == 2
    assert "needs --max-cases" in capsys.readouterr().err
    assert main(["run", "--dataset", example, "--out", str(tmp_path / "c"), "--until-decided",
                 "--max-cases", "500"]) == 2
    assert "has 8 cases" in capsys.readouterr().err
    assert main(["run", "--dataset", example, "--out", str(tmp_path / "d"), "--futility", "0.1"]) == 2
    assert "--futility belongs to a sequential run" in capsys.readouterr().err
    assert main(["run", "--dataset", example, "--out", str(tmp_path / "e"), "--until-decided", "--max-cases", "8",
                 "--futility", "1.5"]) == 2
    assert "a conditional power in [0, 1), got 1.5" in capsys.readouterr().err
    assert not any((tmp_path / x).exists() for x in "abcde")


def test_a_sequential_run_stops_when_decided_and_the_gate_reads_its_design(tmp_path, capsys):
    from kvaudit.cli import main
    from kvaudit.core.run_dir import RunDir

    ds, run, pol = tmp_path / "ds", tmp_path / "run", tmp_path / "p.toml"
    assert main(["generate", "boxoffice", "--out", str(ds), "--cases", "20", "--seed", "1", "--min-docs", "1",
                 "--max-docs", "2", "--min-words", "30", "--max-words", "60"]) == 0
    pol.write_text(POLICY.format(-95.0))
    args = ["run", "--dataset", str(ds), "--out", str(run), "--arms", "recompute,reuse", "--until-decided",
            "--policy", str(pol), "--max-cases", "20", "--look-every", "5", "--max-new-tokens", "8",
            "--no-progress"]
    assert main(args) == 0
    seq = RunDir(run).read_manifest().extra["sequential"]
    stopped = seq["stopped"]["cases"]
    assert stopped < 20 and "every delta threshold decided" in seq["stopped"]["why"]  # a -95 margin: decided early
    assert len(RunDir(run).read_pairs()) == stopped and seq["order"] == "shuffled"
    assert main(["gate", str(run), "--policy", str(pol)]) == 0
    assert f"at {stopped} cases" in capsys.readouterr().out
    assert main(args) == 0 and "already stopped" in capsys.readouterr().out  # the same command: nothing more
