"""Statistics with known answers: planted deltas, A/A, Holm, Wilson, McNemar, clusters, leaks."""

from __future__ import annotations

import numpy as np
import pytest

from kvaudit.stats import paired as stats
from kvaudit.stats.leaks import leak_summary, text_leak
from kvaudit.testing.synthetic import make_pairs


def planted(n: int = 400, loss: float = 0.2, seed: int = 1):
    """Recompute right on 80% of cases; the arm loses `loss` of those. Two cases per cluster."""
    rng = np.random.default_rng(seed)
    ref = (rng.random(n) < 0.8).astype(float)
    arm = ref * (rng.random(n) >= loss)
    clusters = [f"doc{i // 2}" for i in range(n)]
    return ref, arm, clusters


def test_planted_delta_is_found_with_sign_and_ci():
    ref, arm, clusters = planted()
    true = 100 * (arm - ref).mean()
    r = stats.paired_delta(ref, arm, clusters)
    assert r.delta == pytest.approx(true) and r.delta < -10
    assert r.ci[0] < r.delta < r.ci[1] < 0  # interval excludes zero on the loss side
    assert r.lower_bound < r.delta < r.upper_bound < 0
    assert r.test == "mcnemar" and r.p < 1e-6
    assert not stats.non_inferior(r.lower_bound, -2.0)
    assert r.n == 400 and r.n_clusters == 200


def test_planted_gain_has_positive_sign():
    ref, arm, clusters = planted()
    r = stats.paired_delta(arm, ref, clusters)  # swapped: the "arm" now gains
    assert r.ci[0] > 0 and r.p < 1e-6


def test_aa_identical_arms_give_zero_delta_and_no_significance():
    ref, _, clusters = planted()
    r = stats.paired_delta(ref, ref.copy(), clusters)
    assert r.delta == 0.0 and r.p == 1.0
    assert r.ci[0] < 0 < r.ci[1]  # the rule-of-three floor keeps the interval honest
    assert stats.holm([r.p, r.p]) == [1.0, 1.0]
    # 400 unchanged cases bound the loss within -2 points; 20 do not
    assert stats.non_inferior(r.lower_bound, -2.0)
    small = stats.paired_delta(ref[:20], ref[:20], clusters[:20])
    assert small.delta == 0.0 and not stats.non_inferior(small.lower_bound, -2.0)
    assert small.mdd > r.mdd > 0


def test_continuous_scores_use_wilcoxon():
    rng = np.random.default_rng(3)
    ref = rng.uniform(0.3, 1.0, 200)
    arm = np.clip(ref - 0.1 + rng.normal(0, 0.02, 200), 0, 1)
    r = stats.paired_delta(ref, arm, list(range(200)))
    assert r.test == "wilcoxon" and r.p < 1e-10 and r.ci[1] < 0


def test_cluster_bootstrap_is_wider_when_clusters_are_correlated():
    # 20 documents with 10 questions each; every question on a document moves together
    rng = np.random.default_rng(0)
    diffs = np.repeat(rng.choice([-1.0, 0.0, 0.0, 1.0], 20), 10)
    by_doc = stats.cluster_bootstrap_means(diffs, np.repeat(np.arange(20), 10))
    by_case = stats.cluster_bootstrap_means(diffs, np.arange(200))
    assert by_doc.std() > 2 * by_case.std()


def test_holm_known_answer_and_missing_values():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.01, None, float("nan")]) == [0.01, None, None]


def test_wilson_known_answers():
    lo, hi = stats.wilson(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    lo, hi = stats.wilson(0, 10)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.2775, abs=1e-4)
    assert stats.wilson(0, 0) is None


def test_mcnemar_exact_small_counts():
    # 10 discordant pairs all one way: exact two-sided binomial p = 2 * 0.5**10
    ref = np.array([1.0] * 10 + [1.0] * 5)
    arm = np.array([0.0] * 10 + [1.0] * 5)
    assert stats.mcnemar_p(ref, arm) == pytest.approx(2 * 0.5**10)
    assert stats.mcnemar_p(ref, ref) == 1.0


def test_min_detectable_delta_shrinks_with_n_and_is_capped():
    def mdd(n: int) -> float:
        return stats.paired_delta(np.ones(n), np.ones(n), [f"d{i % 20}" for i in range(n)]).mdd

    assert mdd(100) > mdd(1000) > 0
    assert stats.paired_delta([1.0], [1.0], ["a"]).mdd == 100.0  # cannot detect any
    assert stats.paired_delta([], [], []).mdd is None


def test_bounds_stay_within_the_possible_range():
    n = 40
    r = stats.paired_delta(np.zeros(n), np.ones(n), [f"d{i}" for i in range(n)])
    assert r.delta == 100.0 and r.ci[1] == 100.0 and r.upper_bound == 100.0
    assert -100.0 <= r.ci[0] == r.lower_bound < 100.0


def test_single_cluster_gives_no_interval():
    r = stats.paired_delta([1, 1, 0], [0, 1, 0], ["d", "d", "d"])
    assert r.ci is None and r.lower_bound is None and r.delta == pytest.approx(-100 / 3)
    assert not r.decidable and "1 document" in r.reason


def test_text_leak_is_whole_word():
    assert text_leak("Your name is Ada.", "Ada")
    assert text_leak("ADA!", "Ada")
    assert not text_leak("Adam is here", "Ada")


def test_leak_summary_finds_planted_exposure_and_not_noise():
    clean = leak_summary(make_pairs(n_per_task=0, loss={}, leak_probes=30))
    assert clean["n_probes"] == 30
    assert clean["neutral_text_leak_rate"] == 0.0
    assert not clean["neutral_exposure_beyond_chance"]
    fu = clean["exposure"]["first_user"]  # the synthetic unsafe capture adds 1.2 nats
    assert fu["beyond_chance"] and fu["exposure_mean"] == pytest.approx(1.2)
    assert fu["share_first"] > fu["chance_first"] and fu["rank_test_p"] < 1e-6

    leaky = leak_summary(make_pairs(n_per_task=0, loss={}, leak_probes=30, neutral_exposure=1.0))
    neutral = leaky["exposure"]["neutral"]
    assert leaky["neutral_exposure_beyond_chance"]
    assert neutral["share_first"] == 1.0  # every probe's true name gained most
    assert neutral["mean_rank"] < clean["exposure"]["neutral"]["mean_rank"]
    assert neutral["exposure_ci"][0] > 0.9


def test_leak_summary_without_probes():
    s = leak_summary(make_pairs(n_per_task=3, leak_probes=0))
    assert s["n_probes"] == 0 and s["exposure"]["neutral"] is None
    assert not s["neutral_exposure_beyond_chance"] and s["neutral_text_leak_rate"] is None
