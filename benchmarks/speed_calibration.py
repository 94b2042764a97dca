"""Is the speed threshold calibrated? The false-pass rate of a ``[[speed]]`` gate row by simulation.

Run by hand (prints the Markdown table that docs/reports.md quotes)::

    nice -n 10 .venv/bin/python benchmarks/speed_calibration.py [--runs 4000]

A speed row passes when the upper end of the distribution-free (order-statistic) 95% interval of
the median per-case time ratio (arm over its reference) is at most ``max_ratio``
(:mod:`kvaudit.stats.speed`). Each row simulates paired runs of ``n`` cases whose true median ratio
is exactly ``max_ratio`` = 1.05 (the worst case a pass must guard against) under three latency
shapes (:func:`kvaudit.stats.speed.false_pass_rate`): log-normal ratios, Student-t (2 degrees of
freedom) log ratios, and log-normal with a tenth of the requests stalled 5-50x on either side.
Beside it, the same rows judged by the point median alone (``max_ratio`` against the observed median,
the rule a gate without an interval would use) show what the interval buys. **power**: share of runs
that pass when the arm is truly 20% faster (ratio 0.84 at a 1.05 threshold's margin).

The promise: false pass at most alpha/2 = 0.025 (the one-sided level of the 95% interval's end).
Exit status 1 when any row exceeds 0.025 + 3 Monte Carlo standard errors.

``--batches``: cases run N at a time (``--concurrent-cases``), each batch's log ratios shifted
together (normal, sd 0.05 to 0.3; log-normal scenario): the false-pass rate judged per case as if
independent (what kvaudit did before it recorded batches: not promised) beside judged by batch
(:func:`kvaudit.stats.speed.median_ratio_by_batch`, the promise above)::

    nice -n 10 .venv/bin/python benchmarks/speed_calibration.py --batches [--runs 2000]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from kvaudit.stats.speed import false_pass_rate, median_ratio, speed_decision

SCENARIOS = ("lognormal", "heavy", "stalls")
SIZES = (6, 10, 30, 100, 500)
MAX_RATIO = 1.05
ALPHA_HALF = 0.025


def point_median_false_pass(scenario: str, n: int, runs: int, seed: int = 1) -> float:
    """The same simulation judged by the observed median alone (no interval)."""
    rng = np.random.default_rng(seed)
    passed = 0
    for _ in range(runs):
        base = rng.lognormal(math.log(0.05), 0.3, n)
        lr = rng.normal(0.0, 0.1, n) if scenario != "heavy" else 0.05 * rng.standard_t(2, n)
        arm = base * np.exp(lr + math.log(MAX_RATIO))
        passed += float(np.median(arm / base)) <= MAX_RATIO
    return passed / runs


def power(n: int, runs: int, seed: int = 2) -> float:
    rng = np.random.default_rng(seed)
    passed = 0
    for _ in range(runs):
        base = rng.lognormal(math.log(0.05), 0.3, n)
        arm = base * np.exp(rng.normal(0.0, 0.1, n) + math.log(MAX_RATIO / 1.25))
        passed += speed_decision(median_ratio(list(arm), list(base)), MAX_RATIO) == "pass"
    return passed / runs


BATCHES = (4, 8)
BATCH_SDS = (0.05, 0.1, 0.3)
BATCH_SIZES = (64, 200)


def batches(runs: int) -> list[str]:
    """The ``--batches`` table; the rows judged by batch that break the promise."""
    se = math.sqrt(ALPHA_HALF * (1 - ALPHA_HALF) / runs)
    print("| cases | batch | batch sd | false pass, per case (as independent) | false pass, by batch |\n"
          "|---|---|---|---|---|")
    bad = []
    for n in BATCH_SIZES:
        for b in BATCHES:
            for sd in BATCH_SDS:
                kw = {"runs": runs, "seed": n * 100 + b, "batch": b, "batch_sd": sd}
                case = false_pass_rate("lognormal", n, MAX_RATIO, by_batch=False, **kw)
                fp = false_pass_rate("lognormal", n, MAX_RATIO, **kw)
                print(f"| {n} | {b} | {sd} | {case:.4f} | {fp:.4f} ± {se:.4f} |")
                if fp > ALPHA_HALF + 3 * se:
                    bad.append(f"n={n} batch={b} sd={sd}: false pass by batch {fp:.4f} > {ALPHA_HALF} + 3 SE")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--batches", action="store_true", help="cases run several at a time (--concurrent-cases)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.batches:
        bad = batches(args.runs)
        print(f"\n{args.runs} runs per row, {time.perf_counter() - t0:.0f} s")
        for b in bad:
            print("FAIL:", b)
        return 1 if bad else 0
    se = math.sqrt(ALPHA_HALF * (1 - ALPHA_HALF) / args.runs)
    print("| n | scenario | false pass (interval) | false pass (point median) | power at 0.84x |\n|---|---|---|---|---|")
    bad = []
    for n in SIZES:
        pw = power(n, args.runs // 4)
        for sc in SCENARIOS:
            fp = false_pass_rate(sc, n, MAX_RATIO, runs=args.runs, seed=n)
            naive = point_median_false_pass(sc, n, args.runs // 4)
            print(f"| {n} | {sc} | {fp:.4f} ± {se:.4f} | {naive:.3f} | {pw:.3f} |")
            if fp > ALPHA_HALF + 3 * se:
                bad.append(f"n={n} {sc}: false pass {fp:.4f} > {ALPHA_HALF} + 3 SE")
    print(f"\n{args.runs} runs per row, {time.perf_counter() - t0:.0f} s")
    for b in bad:
        print("FAIL:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
