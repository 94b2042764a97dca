"""The speed threshold's statistic: the order-statistic interval of the median per-case ratio, its
edge cases, and a fast slice of benchmarks/speed_calibration.py (false pass at the threshold)."""

from __future__ import annotations

import math

import pytest

from kvaudit.stats.speed import false_pass_rate, median_ratio, order_statistic_rank, speed_decision


def test_the_rank_is_the_sign_test_interval():
    from scipy.stats import binom

    assert order_statistic_rank(5, 0.95) is None  # 2 / 2**5 > 0.05: no interval at 95%
    for n in (6, 10, 30, 100, 501):
        k = order_statistic_rank(n, 0.95)
        assert binom.cdf(k - 1, n, 0.5) <= 0.025 < binom.cdf(k, n, 0.5)


def test_a_ratio_is_taken_per_case_and_bad_times_are_left_out():
    iv = median_ratio([2.0, 4.0, 6.0, 0.0, math.nan], [1.0, 2.0, 3.0, 1.0, 1.0])
    assert iv.n == 3 and iv.median == 2.0 and iv.lower is None  # 3 cases: too few for an interval
    assert speed_decision(iv, 5.0) == "undecided"
    assert median_ratio([], []) is None
    iv = median_ratio([1.0] * 20, [2.0] * 20)
    assert (iv.lower, iv.median, iv.upper) == (0.5, 0.5, 0.5) and speed_decision(iv, 0.5) == "pass"
    assert speed_decision(iv, 0.49) == "fail"


@pytest.mark.parametrize("scenario", ["lognormal", "heavy", "stalls"])
def test_false_pass_at_the_threshold_is_within_alpha_half(scenario):
    # 1000 runs: SE at 0.025 is 0.005. A gate on the point median passes half of these runs.
    rate = false_pass_rate(scenario, 30, 1.05, runs=1000, seed=7)
    assert rate <= 0.025 + 3 * 0.005, rate


def test_the_slice_fails_when_the_interval_is_dropped(monkeypatch):
    # the check can fail: with the upper end replaced by the point median, false pass is near 1/2
    import kvaudit.stats.speed as speed

    real = speed.median_ratio

    def point_only(arm, ref, confidence=0.95):
        iv = real(arm, ref, confidence)
        return speed.RatioInterval(iv.n, iv.median, iv.median, iv.median, confidence)

    monkeypatch.setattr(speed, "median_ratio", point_only)
    assert false_pass_rate("lognormal", 30, 1.05, runs=400, seed=7) > 0.3


def test_cases_run_together_are_judged_by_batch_where_per_case_they_pass_too_often():
    """A slice of speed_calibration.py --batches: 200 cases in batches of 8, each batch's log ratios
    shifted together (sd 0.3). Judged per case as if independent, a gate at the true median passes
    far above alpha/2; judged by batch, within it."""
    kw = {"runs": 600, "seed": 11, "batch": 8, "batch_sd": 0.3}
    per_case = false_pass_rate("lognormal", 200, 1.05, by_batch=False, **kw)
    by_batch = false_pass_rate("lognormal", 200, 1.05, **kw)
    se = (0.025 * 0.975 / 600) ** 0.5
    assert per_case > 0.08, per_case
    assert by_batch <= 0.025 + 3 * se, by_batch


def test_a_batch_counts_once():
    from kvaudit.stats.speed import median_ratio_by_batch

    # three batches: medians 2, 3 and 4 (the 1-case batch counts as much as the 5-case one)
    arm = [2.0, 2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 4.0, math.nan]
    iv = median_ratio_by_batch(arm, [1.0] * 9, ["a"] * 5 + ["b", "b", "c", "d"])
    assert (iv.n, iv.median, iv.unit) == (3, 3.0, "batches") and iv.upper is None  # 3 batches: no interval
    assert median_ratio_by_batch([math.nan], [1.0], ["a"]) is None


def _batched_run(tmp_path, record_batches: bool):
    """48 cases run 8 at a time: reuse's TTFT over recompute's is one ratio per batch (0.9 to 0.98
    in five batches, 1.2 in the sixth), as on an engine where a batch's requests share its step."""
    import json

    from kvaudit.testing.synthetic import make_pairs, make_run

    pairs = make_pairs(n_per_task=12, leak_probes=0)[:48]
    assert len(pairs) == 48
    ratios = [0.9, 0.92, 0.94, 0.96, 0.98, 1.2]
    for i, p in enumerate(pairs):
        for name, arm in p.arms.items():
            arm.ttft_s = 0.1 * (ratios[i // 8] if name == "reuse" else 1.0)
        p.batch = f"0.{i // 8}" if record_batches else None
    run = make_run(tmp_path / "run", pairs)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["backend"]["batching"] = {"concurrent_cases": 8}
    (run / "manifest.json").write_text(json.dumps(manifest))
    policy = tmp_path / "policy.toml"
    policy.write_text('arm = "reuse"\n[[delta]]\ngroup = "overall"\nmin_lower_bound = -100.0\n'
                      '[[speed]]\nname = "ttft"\nmetric = "ttft"\nmax_ratio = 1.1\n')
    return run, policy


def test_a_run_in_batches_is_judged_by_batch_and_one_that_did_not_record_them_is_not_judged(tmp_path):
    """Per case, as if the 48 were independent, the interval's upper end is 0.96 and the row would
    pass; six batches bound the median by their highest (1.2): the row fails. A run that ran cases
    8 at a time without recording which cannot be judged at all."""
    from kvaudit.reports.gate import judge
    from kvaudit.stats.speed import median_ratio

    run, policy = _batched_run(tmp_path / "a", record_batches=True)
    (row,) = [r for r in judge(run, policy).results if r.name == "ttft"]
    assert row.status == "fail" and "on 6 batches" in row.observed and "median over batches" in row.detail
    per_case = median_ratio([0.1 * r for r in [0.9, 0.92, 0.94, 0.96, 0.98, 1.2] for _ in range(8)], [0.1] * 48)
    assert per_case.upper is not None and per_case.upper < 1.1  # what the gate passed before batches were recorded
    run, policy = _batched_run(tmp_path / "b", record_batches=False)
    (row,) = [r for r in judge(run, policy).results if r.name == "ttft"]
    assert row.status == "error" and "8 at a time" in row.detail
    # cases that lost their batch in a run that ran 8 at a time: not taken as cases alone
    lines = (tmp_path / "a" / "run" / "pairs.jsonl").read_text().splitlines()
    edited = [line.replace('"batch": "0.5"', '"batch": null') for line in lines]
    assert edited != lines
    (tmp_path / "a" / "run" / "pairs.jsonl").write_text("\n".join(edited) + "\n")
    (row,) = [r for r in judge(tmp_path / "a" / "run", policy).results if r.name == "ttft"]
    assert row.status == "error" and "8 at a time" in row.detail


@pytest.mark.parametrize("concurrent, recorded", [(1, False), (2, True), (4, True), (4, False)])
def test_the_timing_channel_of_cases_run_together_is_judged_by_batch(tmp_path, concurrent, recorded):
    """Cases run together share their batch's timing: the timing AUC then compares cases of
    different batches and its interval clusters by batch (coverage by case 0.23-0.80 in batches of
    4-16, by batch at least 0.95: timing_calibration.py --batches). Batches recorded: judged on
    the batches, the row says how many, and fewer than 10 batches cannot judge (32 cases 4 at a time:
    8); not recorded: cannot judge, and the report says why."""
    import copy
    import json

    from kvaudit.cli import main
    from kvaudit.reports.gate import judge
    from kvaudit.testing.synthetic import make_pairs, make_run

    pairs = make_pairs(n_per_task=8, leak_probes=0)
    for i, p in enumerate(pairs):
        other = copy.deepcopy(p.arms["recompute"])
        other.arm, other.cache_hit_tokens, other.tokens_reused = "reuse_other_tenant", 0, 0
        batch_load = 0.02 * ((i // 4) % 5)  # a batch's requests share its timing
        other.ttft_s = 0.1 + 0.01 * (i % 7) + batch_load
        p.arms["reuse"].ttft_s = 0.1 + 0.01 * ((i + 3) % 7) + batch_load
        p.arms["reuse_other_tenant"] = other
        p.arm_order.append("reuse_other_tenant")
        p.batch = f"0.{i // concurrent}" if concurrent > 1 and recorded else None
    run = make_run(tmp_path / "run", pairs)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["backend"]["batching"] = {"concurrent_cases": concurrent}
    (run / "manifest.json").write_text(json.dumps(manifest))
    policy = tmp_path / "policy.toml"
    policy.write_text('arm = "reuse"\n[[delta]]\ngroup = "overall"\nmin_lower_bound = -100.0\n'
                      "[security]\nmax_timing_auc = 0.9\nmissing = \"skip\"\n")
    rows = {r.kind: r for r in judge(run, policy).results}
    timing = rows["timing"]
    assert "segment reuse: AUC" in timing.observed
    n = len(pairs)
    assert n == 32
    if concurrent == 1:
        assert timing.status == "pass" and f"on {n} cases," in timing.observed, timing
    elif recorded and concurrent == 2:
        assert timing.status == "pass" and f"on {n} cases in 16 batches" in timing.observed, timing
    elif recorded:
        assert timing.status == "error" and f"on {n} cases in 8 batches" in timing.observed, timing
        assert "fewer than 10 batches" in timing.detail, timing
    else:
        assert timing.status == "error" and "not recorded" in timing.detail, timing
    assert main(["report", str(run)]) == 0
    html = (run / "report.html").read_text()
    assert ('id="timing-batched"' in html) == (concurrent > 1)
    assert ('id="timing-unjudged"' in html) == (concurrent > 1 and not recorded)
