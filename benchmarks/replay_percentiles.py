"""Coverage of the TTFT percentile intervals ``kvaudit replay`` reports (distribution-free binomial
intervals, ``kvaudit.replay.summary.percentile_interval``), by simulation.

For each sample size, quantile and shape of latency distribution (lognormal, a heavy-tailed
Pareto, and a two-mode mix like warm hits and cold misses), draws ``reps`` samples, computes the
95% interval of the quantile and counts how often it holds the true quantile (an end the sample
cannot bound counts as covering on its side). The stated level holds when coverage is at least
0.95 minus three Monte Carlo standard errors. A fast slice runs in tests/test_replay.py.

``--queued`` measures the same intervals on TTFTs of requests that queue (an open-loop replay:
``benchmarks/saturation_calibration.py``'s queue of 1 or 8 servers at utilisation 0.5 to 0.9,
starting empty), against the quantile pooled over 600 replays of the same length. Queued requests'
TTFTs are correlated (a busy period delays many in a row), so an interval that assumes independent
requests is too narrow there: this is why ``kvaudit replay`` claims no level for its intervals
under ``--rate`` (docs/replay.md, "Intervals under load").

``--waves`` measures them on a closed loop served in waves of C requests (``kvaudit replay
--concurrency C`` without ``--rate``): a wave's requests are prefilled in one batch and get their
first tokens together, so each TTFT is the wave's (the sum of its requests' lognormal prefill
times), against the quantile pooled over 600 replays. With C = 1 that is the independent case;
from C = 2 the intervals are too narrow, which is why a replay whose waves held more than one
request claims no level.

``--replications`` measures what ``kvaudit replay --replications K`` claims instead
(:mod:`kvaudit.stats.replications`): on the same queues, groups of K independent replays, each
group's median p50/p95/p99 with its distribution-free interval, against the median over 3,000
other replays of the same length of that replay-level percentile (the claimed target: at or above
0.95 within three Monte Carlo standard errors, every row), and, not claimed, against the percentile
of all requests pooled over those replays, with the ratio of the pooled to the claimed target.

    python benchmarks/replay_percentiles.py [--reps 2000] [--seed 0]
    python benchmarks/replay_percentiles.py --queued [--reps 300]
    python benchmarks/replay_percentiles.py --replications [--reps 3000]
    python benchmarks/replay_percentiles.py --waves [--reps 300]
"""

from __future__ import annotations

import argparse

import numpy as np

from kvaudit.replay.summary import CONFIDENCE, percentile_interval
from kvaudit.stats.replications import median_interval

SHAPES = {
    "lognormal": (lambda rng, n: rng.lognormal(0.0, 0.6, n), lambda q: float(np.exp(0.6 * _z(q)))),
    "pareto": (lambda rng, n: 1 + rng.pareto(2.5, n), lambda q: float((1 - q) ** (-1 / 2.5))),
}


def _z(q: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(q))


def _mix(rng: np.random.Generator, n: int) -> np.ndarray:
    cold = rng.random(n) < 0.3
    return np.where(cold, rng.normal(1.0, 0.05, n), rng.normal(0.1, 0.01, n))


def _mix_quantile(q: float) -> float:
    rng = np.random.default_rng(12345)
    return float(np.quantile(_mix(rng, 4_000_000), q))


def coverage_grid(reps: int = 2000, seed: int = 0, sizes: tuple[int, ...] = (30, 100, 500, 2500),
                  quantiles: tuple[float, ...] = (0.5, 0.95, 0.99)) -> list[dict]:
    rng = np.random.default_rng(seed)
    shapes = dict(SHAPES)
    shapes["warm/cold mix"] = (_mix, _mix_quantile)
    rows = []
    for name, (draw, true_q) in shapes.items():
        for q in quantiles:
            truth = true_q(q)
            for n in sizes:
                hit = 0
                unbounded = 0
                for _ in range(reps):
                    iv = percentile_interval(draw(rng, n), q)
                    lo = -np.inf if iv["low"] is None else iv["low"]
                    hi = np.inf if iv["high"] is None else iv["high"]
                    hit += lo <= truth <= hi
                    unbounded += iv["high"] is None
                cov = hit / reps
                rows.append({"shape": name, "quantile": q, "n": n, "coverage": cov,
                             "mc_se": float(np.sqrt(max(cov * (1 - cov), 1e-4) / reps)),
                             "open_above": unbounded / reps})
    return rows


def _queue():
    """The FCFS queue of ``benchmarks/saturation_calibration.py`` (beside this file)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from saturation_calibration import replay_queue

    return replay_queue


def _covers(iv: dict, truth: float) -> bool:
    """Whether an interval holds ``truth`` (an end it cannot bound covers on its side)."""
    return (iv["low"] is None or iv["low"] <= truth) and (iv["high"] is None or truth <= iv["high"])


def queued_coverage(reps: int = 300, seed: int = 0, utilisations: tuple[float, ...] = (0.5, 0.8, 0.9),
                    sizes: tuple[int, ...] = (100, 500), servers: tuple[int, ...] = (1, 8),
                    quantiles: tuple[float, ...] = (0.5, 0.95), pool: int = 600) -> list[dict]:
    """Coverage of the intervals on one open-loop replay's TTFTs, of the quantile over many replays."""
    replay_queue = _queue()
    rng = np.random.default_rng(seed)
    rows = []
    for c in servers:
        for u in utilisations:
            for n in sizes:
                samples = [replay_queue(rng, n, u, c)[1] for _ in range(reps)]
                pooled = np.concatenate([replay_queue(rng, n, u, c)[1] for _ in range(pool)])
                for q in quantiles:
                    truth = float(np.quantile(pooled, q))
                    hit = 0
                    for t in samples:
                        hit += _covers(percentile_interval(t, q), truth)
                    rows.append({"servers": c, "utilisation": u, "n": n, "quantile": q, "coverage": hit / reps})
    return rows


def wave_replay(rng: np.random.Generator, n: int, wave: int) -> np.ndarray:
    """TTFTs of ``n`` requests served in waves of ``wave``: each request's the sum of its wave's
    prefill times (one batch; every request's first token at its end)."""
    x = rng.lognormal(0.0, 0.5, n)
    return np.concatenate([np.full(len(x[s:s + wave]), x[s:s + wave].sum()) for s in range(0, n, wave)])


def wave_coverage(reps: int = 300, seed: int = 0, waves: tuple[int, ...] = (1, 2, 4, 8), sizes: tuple[int, ...] = (100, 500),
                  quantiles: tuple[float, ...] = (0.5, 0.95), pool: int = 600) -> list[dict]:
    """Coverage of the intervals on one closed-loop replay in waves, of the quantile over many replays."""
    rng = np.random.default_rng(seed)
    rows = []
    for w in waves:
        for n in sizes:
            samples = [wave_replay(rng, n, w) for _ in range(reps)]
            pooled = np.concatenate([wave_replay(rng, n, w) for _ in range(pool)])
            for q in quantiles:
                truth = float(np.quantile(pooled, q))
                hit = 0
                for t in samples:
                    hit += _covers(percentile_interval(t, q), truth)
                rows.append({"wave": w, "n": n, "quantile": q, "coverage": hit / reps})
    return rows


def replicated_coverage(replays: int = 3000, seed: int = 0, ks: tuple[int, ...] = (6, 10),
                        utilisations: tuple[float, ...] = (0.5, 0.8, 0.9), sizes: tuple[int, ...] = (100, 500),
                        servers: tuple[int, ...] = (1, 8), quantiles: tuple[float, ...] = (0.5, 0.95, 0.99)) -> list[dict]:
    """Coverage of the median-over-replications interval, per queue, load, length, K and quantile:
    ``replays`` replays drawn for the groups (disjoint groups of K), as many for the targets."""
    replay_queue = _queue()
    rng = np.random.default_rng(seed)
    rows = []
    for c in servers:
        for u in utilisations:
            for n in sizes:
                drawn = [replay_queue(rng, n, u, c)[1] for _ in range(replays)]
                other = [replay_queue(rng, n, u, c)[1] for _ in range(replays)]
                for q in quantiles:
                    est = np.array([np.quantile(t, q, method="inverted_cdf") for t in drawn])
                    target = float(np.median([np.quantile(t, q, method="inverted_cdf") for t in other]))
                    pooled = float(np.quantile(np.concatenate(other), q))
                    for k in ks:
                        hit = pooled_hit = groups = 0
                        for g in range(len(est) // k):
                            iv = median_interval(est[g * k:(g + 1) * k])
                            hit += _covers(iv, target)
                            pooled_hit += _covers(iv, pooled)
                            groups += 1
                        cov = hit / groups
                        rows.append({"servers": c, "utilisation": u, "n": n, "quantile": q, "k": k, "groups": groups,
                                     "coverage": cov, "mc_se": (CONFIDENCE * (1 - CONFIDENCE) / groups) ** 0.5,
                                     "pooled_coverage": pooled_hit / groups, "pooled_over_target": pooled / target})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--queued", action="store_true", help="TTFTs of requests that queue (open loop), not independent")
    ap.add_argument("--replications", action="store_true",
                    help="the median over K independent replays and its interval (kvaudit replay --replications)")
    ap.add_argument("--waves", action="store_true", help="a closed loop in waves that share a batch")
    args = ap.parse_args()
    if args.waves:
        print(f"{'wave':>4} {'n':>5} {'q':>5} {'coverage':>9}  (claimed only for waves of 1)")
        for r in wave_coverage(args.reps if args.reps != 2000 else 300, args.seed):
            print(f"{r['wave']:>4} {r['n']:>5} {r['quantile']:>5} {r['coverage']:>9.3f}")
        return
    if args.replications:
        print(f"{'servers':>7} {'util':>5} {'n':>5} {'q':>5} {'K':>3} {'groups':>6} {'coverage':>9} {'MC SE':>6}  ok   "
              f"{'pooled cov':>10} {'pooled/target':>13}  (claimed: coverage of the median replay's percentile)")
        rows = replicated_coverage(args.reps if args.reps != 2000 else 3000, args.seed)
        for r in rows:
            ok = r["coverage"] >= CONFIDENCE - 3 * r["mc_se"]
            print(f"{r['servers']:>7} {r['utilisation']:>5} {r['n']:>5} {r['quantile']:>5} {r['k']:>3} {r['groups']:>6} "
                  f"{r['coverage']:>9.3f} {r['mc_se']:>6.3f}  {'yes' if ok else 'NO '}  {r['pooled_coverage']:>10.3f} "
                  f"{r['pooled_over_target']:>13.2f}")
        print(f"claimed rows meeting 0.95 within 3 MC SE: {sum(r['coverage'] >= CONFIDENCE - 3 * r['mc_se'] for r in rows)}"
              f" of {len(rows)}")
        return
    if args.queued:
        print(f"{'servers':>7} {'utilisation':>11} {'n':>5} {'q':>5} {'coverage':>9}  (claimed: none)")
        for r in queued_coverage(args.reps, args.seed):
            print(f"{r['servers']:>7} {r['utilisation']:>11} {r['n']:>5} {r['quantile']:>5} {r['coverage']:>9.3f}")
        return
    rows = coverage_grid(args.reps, args.seed)
    print(f"{'shape':<14} {'q':>5} {'n':>5} {'coverage':>9} {'MC SE':>6} {'open above':>10}  ok")
    for r in rows:
        ok = r["coverage"] >= CONFIDENCE - 3 * r["mc_se"]
        print(f"{r['shape']:<14} {r['quantile']:>5} {r['n']:>5} {r['coverage']:>9.3f} {r['mc_se']:>6.3f} "
              f"{r['open_above']:>10.2f}  {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
