"""Whether a load replay ran past what the server sustains, and the highest load an SLO allows.

Served at their arrivals, a server that keeps up holds time to first token level over the
replay; past saturation requests arrive faster than they are served, the queue grows, and TTFT
grows with the replay's length at about offered / served - 1 seconds per second of arrivals. Its
percentiles then describe how long the replay ran, not the load: a short replay past saturation
can meet a p95 SLO that a longer one at the same load misses by minutes.

The growth is the Theil-Sen slope of TTFT against arrival time (the median of pairwise slopes: a
few slow requests do not move it); a load whose TTFT grows by more than ``GROWTH_LIMIT`` seconds
per second of arrivals (1.2 s a minute: served about 2% below offered) is past saturation. The
limit is low because a miss is the error that matters (a load the server cannot sustain named
sustainable); a false flag only drops a load from the SLO reading. The rule is a point estimate,
not a test: queued requests' TTFTs are correlated, so a slope interval that assumes independent
requests would be too narrow. Its operating characteristic (how often it flags a load a queue
sustains, and misses one it does not, by utilisation, servers and replay length) is
``benchmarks/saturation_calibration.py``, a fast slice in tests/test_saturation.py: with 200
requests or more it misses at most 10% of loads at 1.2 times capacity and flags at most 5% at half
of it; with 500, at most 5% either way at 1.2 and 0.7. Shorter replays are judged by the same rule
with weaker guarantees (at 80 requests up to 14% missed at 1.2, 42% flagged at 0.8).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

GROWTH_LIMIT = 0.02  # seconds of TTFT per second of arrivals
MIN_REQUESTS = 20  # fewer cannot tell a growing queue from the spread of service times
MAX_PAIRS_REQUESTS = 2000  # Theil-Sen is quadratic: longer replays are thinned evenly in arrival order


def ttft_growth(arrival_s: Sequence[float] | np.ndarray, ttft_s: Sequence[float] | np.ndarray) -> dict[str, Any] | None:
    """TTFT's growth over a replay's arrivals (seconds per second) and whether it is past
    saturation; None with fewer than ``MIN_REQUESTS`` requests, arrivals all at one instant, or a
    time that is not a finite number."""
    from scipy.stats import theilslopes

    a = np.asarray(arrival_s, dtype=float)
    t = np.asarray(ttft_s, dtype=float)
    n = len(a)
    if n < MIN_REQUESTS or not (np.isfinite(a).all() and np.isfinite(t).all()) or float(np.ptp(a)) <= 0.0:
        return None
    if n > MAX_PAIRS_REQUESTS:
        keep = np.argsort(a, kind="stable")[np.linspace(0, n - 1, MAX_PAIRS_REQUESTS).round().astype(int)]
        a, t = a[keep], t[keep]
    slope = float(theilslopes(t, a)[0])
    return {"requests": n, "slope": slope, "limit": GROWTH_LIMIT, "past_saturation": slope > GROWTH_LIMIT}


def highest_sustained(loads: Sequence[dict[str, Any]], slo_s: float) -> float | None:
    """The highest offered load (``rate``) at which p95 TTFT (``p95_s``) met the SLO and the server
    kept up (``past_saturation`` not true), every lighter load too; None when the lightest did not.
    A load past saturation never counts, whatever its p95: that p95 grows with the replay's length."""
    best = None
    for x in sorted(loads, key=lambda x: x["rate"]):
        if x["p95_s"] > slo_s or x.get("past_saturation"):
            break
        best = x["rate"]
    return best
