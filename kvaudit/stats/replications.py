"""A load's TTFT percentiles from independent replications: the same workload replayed at the same
offered load with different arrival seeds, each from empty caches.

One open-loop replay cannot bound its own percentiles: its requests queue behind each other, so
their TTFTs are correlated and an interval that assumes independent requests is far too narrow
(coverage of p95 0.20 at utilisation 0.8 on one server: ``benchmarks/replay_percentiles.py
--queued``). Replications are independent of each other. Each gives one estimate of a percentile
(its p95, say); the reported value is their median, and its interval the distribution-free
binomial interval of a median (:func:`scipy.stats.quantile_test` on the replications' values),
exact for any distribution of the estimates: with 6 replications at 95% it is their lowest to
their highest (coverage 1 - 2/2**6 = 0.969); with 5 or fewer both ends stay open (``None``).

What it covers: the median, over arrival draws, of the percentile a replay of this many requests
at this load gives (half of such replays give a p95 above it, half below). That is not the p95
of all requests pooled over a long run: queues make some replays' tails much heavier than
others', and the pooled p95 lies above the median replay's (33% above at utilisation 0.9 on one
server, 500 requests): measured beside the claimed coverage in the benchmark, not claimed.
``benchmarks/replay_percentiles.py --replications``; a fast slice in tests/test_replications.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import quantile_test

CONFIDENCE = 0.95
FULL_INTERVAL = 6  # the fewest replications whose 95% interval has both ends


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, float | None]:
    """The median of independent replications' ``values`` and its distribution-free interval
    (``None`` for an end too few replications cannot bound)."""
    x = np.asarray(values, np.float64)
    if not len(x) or not np.all(np.isfinite(x)):
        raise ValueError("median_interval needs one or more finite values")
    value = float(np.quantile(x, 0.5, method="inverted_cdf"))
    if len(x) < 2:
        return {"value": value, "low": None, "high": None}
    ci = quantile_test(x, q=value, p=0.5).confidence_interval(confidence)
    return {"value": value,
            "low": float(ci.low) if math.isfinite(ci.low) else None,
            "high": float(ci.high) if math.isfinite(ci.high) else None}
