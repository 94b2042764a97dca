"""The gate's calibration, fast slice: false-pass rate at the margin and coverage for a few
cells of ``benchmarks/gate_calibration.py`` (which the old statistic fails), plus known-answer
tests of :mod:`kvaudit.stats.noninferiority`."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest

from kvaudit.stats.calibration import Design, mc_se, pilot_design, rates, simulate_diffs
from kvaudit.stats.noninferiority import (
    MIN_CLUSTERS,
    _score_lower,
    check_confidence,
    design_effect,
    detectable_delta,
    paired_bound,
)

from .conftest import load_benchmark

ALPHA_CEILING = 0.05  # the ceiling; the bound's one-sided level promises 0.025
COVERAGE_FLOOR = 0.94
REPS = 300


def _benchmark():
    return load_benchmark("gate_calibration")


def _calibrated(r) -> list[str]:
    """The slice's check (MC SE at the target rate): reasons the cell misses, empty if none."""
    out = []
    if r.passed > ALPHA_CEILING + 3 * mc_se(ALPHA_CEILING, r.reps):
        out.append(f"false pass {r.passed:.3f} over {r.reps} runs")
    if r.covered is not None and r.covered < COVERAGE_FLOOR - 3 * mc_se(COVERAGE_FLOOR, r.decided):
        out.append(f"coverage {r.covered:.3f} over {r.decided} decided runs")
    return out


SLICE = {
    "binary n=200, 5 cases/doc, half on two documents": Design(n=200, cluster_size=5, multi_doc_share=0.5),
    "F1-like n=200, one case per document": Design(n=200, cluster_size=1, score="f1"),
    "binary n=1000, half two-hop over 30 documents": Design(n=1000, cluster_size=50, multi_doc_share=0.5),
    # losses on a few fragile documents: with the design effect ignored (clusters counted as
    # independent) coverage falls to 0.880 over these 300 runs and this cell fails
    "concentrated n=400, 10 cases/doc": Design(n=400, cluster_size=10, heterogeneity=0.95, fragile_share=0.1),
}


@pytest.mark.parametrize("name", list(SLICE))
def test_new_gate_is_calibrated_at_the_margin(name: str) -> None:
    design = SLICE[name]
    r = rates(design, -0.02, -0.02, reps=REPS, seed=11)
    assert r.undecidable == 0
    assert not _calibrated(r), f"{name}: {_calibrated(r)}"


def test_old_gate_fails_the_same_check_on_finding_3() -> None:
    """The percentile cluster bootstrap (exact evidence sets, rule-of-three floor, one-sided 95%)
    passes about 12% of runs at the margin at n=200: the slice must catch that."""
    old = partial(_benchmark().old_gate, n_boot=500)
    r = rates(Design(n=200, cluster_size=5), -0.02, -0.02, reps=REPS, seed=11, statistic=old)
    assert any(w.startswith("false pass") for w in _calibrated(r)), r
    new = rates(Design(n=200, cluster_size=5), -0.02, -0.02, reps=REPS, seed=11)
    assert not _calibrated(new) and new.passed < r.passed


def test_simulated_true_delta_is_exact() -> None:
    for design in (Design(n=1000, cluster_size=5, multi_doc_share=0.5), Design(n=1000, score="f1"),
                   Design(n=1000, cluster_size=5, heterogeneity=0.95, fragile_share=0.1)):
        rng = np.random.default_rng(3)
        # 100 simulated runs: 4 SE of their mean is about 0.004, so a bias of half a point fails
        means = [simulate_diffs(design, -0.02, rng)[0].mean() for _ in range(100)]
        assert abs(np.mean(means) + 0.02) < 4 * np.std(means) / math.sqrt(len(means))


# ----------------------------------------------------------------------------- known answers

def _tango_lower(gains: int, losses: int, n: int, z: float) -> float:
    """Tango (1998) score bound for p(gain) - p(loss) in closed form: the restricted MLE of the
    loss probability is the root of a quadratic; solve Z(delta) = z by bisection."""
    def stat(delta: float) -> float:
        a, b = 2 * n, -gains - losses + (2 * n - gains + losses) * delta
        c = -losses * delta * (1 - delta)
        p_loss = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
        return (gains - losses - n * delta) / math.sqrt(n * (2 * p_loss + delta * (1 - delta)))

    lo, hi = -1 + 1e-12, (gains - losses) / n
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if stat(mid) > z else (lo, mid)
    return (lo + hi) / 2


def _paired(losses: int, gains: int, n: int) -> np.ndarray:
    return np.array([-1.0] * losses + [1.0] * gains + [0.0] * (n - losses - gains))


def test_score_lower_equals_tango_for_paired_binary() -> None:
    d = _paired(8, 2, 200)
    assert _score_lower(d, 1.96, 1.0) == pytest.approx(-0.068396, abs=1e-6)
    assert _tango_lower(2, 8, 200, 1.96) == pytest.approx(-0.068396, abs=1e-6)
    for losses, gains, n in ((0, 3, 40), (15, 1, 120), (5, 5, 60), (30, 0, 300)):
        assert _score_lower(_paired(losses, gains, n), 1.645, 1.0) == pytest.approx(
            _tango_lower(gains, losses, n, 1.645), abs=1e-7)
        # the upper bound is the lower bound of the mirrored data
        assert -_score_lower(-_paired(losses, gains, n), 1.645, 1.0) == pytest.approx(
            -_tango_lower(losses, gains, n, 1.645), abs=1e-7)


def test_paired_bound_is_tango_at_the_t_quantile_with_one_document_per_case() -> None:
    from scipy.stats import t

    d = _paired(8, 2, 200)
    b = paired_bound(d, [[f"doc{i}"] for i in range(200)])
    assert b.decidable and b.n_clusters == 200 and b.df == 199 and b.deff == pytest.approx(1.0)
    z = float(t.ppf(0.975, 199))
    assert b.lower == pytest.approx(_tango_lower(2, 8, 200, z), abs=1e-6)
    assert b.upper == pytest.approx(-_tango_lower(8, 2, 200, z), abs=1e-6)
    assert b.mean == pytest.approx(-0.03) and b.lower < b.mean < b.upper


def test_no_discordant_pairs_give_the_closed_form_bound() -> None:
    z = 1.96
    assert _score_lower(np.zeros(50), z, 1.0) == pytest.approx(-z * z / (50 + z * z), abs=1e-7)
    b = paired_bound(np.zeros(50), [[f"d{i}"] for i in range(50)])
    assert b.mean == 0 and b.lower < -0.05  # 50 unchanged cases cannot rule out -2 points
    assert detectable_delta(b) > 0.05


def test_two_documents_cannot_decide() -> None:
    b = paired_bound(np.zeros(200), [["A"] if i % 2 else ["B"] for i in range(200)])
    assert not b.decidable and b.lower is None and b.n_clusters == 2
    assert "2 document" in b.reason and str(MIN_CLUSTERS) in b.reason
    ok = paired_bound(np.zeros(200), [[f"d{i % MIN_CLUSTERS}"] for i in range(200)])
    assert ok.decidable


def test_a_two_document_case_correlates_with_both_documents() -> None:
    """Losses shared by the cases on A, on B and on {A, B}: treating {A, B} as its own label
    (the old exact evidence sets) hides the dependence; set membership does not."""
    rng = np.random.default_rng(0)
    members, diffs = [], []
    for doc in range(40):
        bad = doc < 4
        for _ in range(3):
            members.append([f"d{doc}"])
            diffs.append(-1.0 if bad and rng.random() < 0.8 else 0.0)
    for a, b in [(0, 1), (1, 2), (2, 3), (3, 0)] * 6 + [(10 + k, 20 + k) for k in range(15)]:
        members.append([f"d{a}", f"d{b}"])
        diffs.append(-1.0 if a < 4 and rng.random() < 0.8 else 0.0)
    d = np.asarray(diffs)
    shared, _ = design_effect(d, members)
    exact, _ = design_effect(d, [["|".join(m)] for m in members])
    assert shared > exact > 1
    by_sets = paired_bound(d, members)
    by_labels = paired_bound(d, [["|".join(m)] for m in members])
    assert by_sets.lower < by_labels.lower and by_sets.n_eff < by_labels.n_eff


@pytest.mark.parametrize("bad", [0.5, 0.79, 1.0, 95, True, "0.95", None])
def test_check_confidence_rejects(bad) -> None:
    with pytest.raises(ValueError, match="confidence"):
        check_confidence(bad)
    with pytest.raises(ValueError):
        paired_bound([0.0] * 20, [[f"d{i}"] for i in range(20)], confidence=bad)


def test_check_confidence_accepts_usual_levels() -> None:
    assert check_confidence(0.95) == 0.95 and check_confidence(0.9) == 0.9


def test_pilot_design_reads_the_shape_of_a_run() -> None:
    ref = [1.0] * 80 + [0.0] * 20
    arm = [1.0] * 76 + [0.0] * 4 + [0.0] * 18 + [1.0] * 2
    members = [[f"d{i % 25}"] if i % 2 else [f"d{i % 25}", f"d{(i + 1) % 25}"] for i in range(100)]
    d = pilot_design(ref, arm, members)
    assert d.n == 100 and d.score == "binary" and d.multi_doc_share == 0.5
    assert d.n_documents == 25 and d.base_accuracy == pytest.approx(0.8)
    assert d.gain_rate == pytest.approx(0.06 / (2 * 0.2))
    assert pilot_design([0.5, 1.0] * 10, [0.4, 1.0] * 10, [[f"d{i}"] for i in range(20)]).score == "f1"


# ----------------------------------------------------------------------------- sequential slice

SEQ_SLICE = {
    "binary n=1000, 2 cases/doc": (Design(n=1000, cluster_size=2), -0.02),
    "multi-hop F1 n=200 at -5 points": (Design(n=200, cluster_size=5, multi_doc_share=1.0, score="f1"), -0.05),
}


@pytest.mark.parametrize("name", list(SEQ_SLICE))
def test_sequential_gate_is_calibrated_on_the_gate_grid(name: str) -> None:
    """The sequential gate (a look every tenth) on cells of the fixed gate's grid: false pass at
    the margin within alpha + 3 MC SE, and a clear loss stopped well before the maximum."""
    from kvaudit.stats.sequential import default_look_every, design, operating_characteristic

    bench = _benchmark()
    d, margin = SEQ_SLICE[name]
    oc = operating_characteristic(d, margin, design(d.n, default_look_every(d.n), bench.SEQ_ALPHA), reps=REPS, seed=5)
    assert not bench.check_seq(oc), f"{name}: {bench.check_seq(oc)}"
    assert oc["loss"].mean_cases <= 0.3 * d.n
    assert oc["zero"].passed >= 0.8


def test_repeated_looks_without_alpha_spending_fail_the_sequential_check() -> None:
    """Testing at the fixed level at every look (no spending) inflates the false-pass rate well
    past alpha: the benchmark's check must catch it."""
    from dataclasses import replace

    from kvaudit.stats.sequential import default_look_every, design, simulate

    bench = _benchmark()
    d, margin = SEQ_SLICE["binary n=1000, 2 cases/doc"]
    plan = design(d.n, default_look_every(d.n), bench.SEQ_ALPHA)
    naive = replace(plan, nominal_alpha=(bench.SEQ_ALPHA,) * len(plan.looks), futility=0.0)
    # 300 runs: the naive rule passes 6.7% against a limit of 5.2% (600 runs: 7.5% against 4.4%)
    r = simulate(d, margin, naive, margin, reps=REPS, seed=5)
    assert bench.check_seq({"margin": r}), r
    assert r.fixed_passed < r.passed  # the same runs judged once, at the end, do not


def test_the_flip_threshold_holds_its_level_at_the_boundary_and_the_slice_fails_without_documents():
    """benchmarks/flip_calibration.py's hardest cell (10 questions on each of 20 documents,
    intra-document correlation 0.2) at a true flip rate equal to the threshold: the gate's bound
    passes at most the one-sided 2.5% plus 3 Monte Carlo SE; the same bound with every case its own
    document passes far more often, so this slice fails when the design effect is dropped."""
    flips = load_benchmark("flip_calibration")
    reps = 300
    limit = flips.ALPHA_ONE_SIDED + 3 * mc_se(flips.ALPHA_ONE_SIDED, reps)
    assert flips.pass_rate(0.10, 0.10, 20, 10, 0.2, reps, 4) <= limit
    assert flips.pass_rate(0.10, 0.10, 20, 10, 0.2, reps, 4, ignore_documents=True) > limit
    assert flips.pass_rate(0.03, 0.10, 20, 10, 0.2, reps, 5) > 0.5  # and it passes a low flip rate
