"""The past-saturation rule (kvaudit.stats.saturation): a fast slice of its operating
characteristic (benchmarks/saturation_calibration.py) and its edges."""

from __future__ import annotations

import numpy as np
import pytest

from kvaudit.stats.saturation import GROWTH_LIMIT, MIN_REQUESTS, highest_sustained, ttft_growth
from tests.conftest import load_benchmark


@pytest.mark.parametrize("utilisation, servers, replications", [(0.5, 1, 1), (1.5, 1, 1), (0.5, 8, 1), (1.5, 8, 1),
                                                                (0.5, 1, 6), (1.2, 8, 6)])
def test_the_rule_meets_its_stated_characteristic_on_a_slice(utilisation, servers, replications):
    # replications: a load past saturation when any of its replays is (kvaudit replay --replications)
    bench = load_benchmark("saturation_calibration")
    reps, n = 60 // replications * 2 if replications > 1 else 60, 200
    rate = bench.flag_rate(np.random.default_rng(7), reps, n, utilisation, servers, 1.0, replications)
    err = rate if utilisation < 1 else 1 - rate
    limit = bench.claimed_limit(n, utilisation)
    assert limit is not None and err <= limit + 3 * (limit * (1 - limit) / reps) ** 0.5, (rate, limit)


def test_a_queue_that_grows_is_past_saturation_and_one_that_holds_is_not():
    a = np.arange(100) / 2.0  # 50 s of arrivals
    jitter = np.random.default_rng(0).lognormal(0, 0.5, 100)
    assert not ttft_growth(a, jitter)["past_saturation"]
    grown = ttft_growth(a, jitter + 0.2 * a)  # 10 s more at the end than at the start
    assert grown["past_saturation"] and abs(grown["slope"] - 0.2) < 0.05 and grown["limit"] == GROWTH_LIMIT
    # one very slow request at the end does not make a growing queue (the median of pairwise slopes)
    tail = jitter.copy()
    tail[-1] = 60.0
    assert not ttft_growth(a, tail)["past_saturation"]


def test_too_few_requests_or_one_instant_cannot_tell():
    assert ttft_growth(np.arange(MIN_REQUESTS - 1), np.ones(MIN_REQUESTS - 1)) is None
    assert ttft_growth(np.zeros(50), np.arange(50.0)) is None
    assert ttft_growth(np.arange(50.0), np.r_[np.arange(49.0), np.nan]) is None


def test_a_long_replay_is_thinned_not_refused():
    a = np.arange(5000) / 10.0
    g = ttft_growth(a, 0.5 + 0.1 * a)
    assert g["requests"] == 5000 and abs(g["slope"] - 0.1) < 1e-9


def test_the_highest_sustained_load_stops_at_the_first_load_that_fails():
    loads = [{"rate": 1, "p95_s": 0.1}, {"rate": 2, "p95_s": 0.9}, {"rate": 3, "p95_s": 0.2},
             {"rate": 0.5, "p95_s": 0.1, "past_saturation": False}]
    assert highest_sustained(loads, 0.5) == 1
    assert highest_sustained(loads, 1.0) == 3
    assert highest_sustained([{**x, "past_saturation": x["rate"] == 2} for x in loads], 1.0) == 1
