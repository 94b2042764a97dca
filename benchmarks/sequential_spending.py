"""Which alpha-spending design saves most at equal power? Sequential designs side by side, simulated.

    nice -n 10 .venv/bin/python benchmarks/sequential_spending.py [--fixed-n 550] [--margin -0.02] [--reps 300]

Issue 27 asks a sequential gate for at most 80% of the fixed design's cases at a true delta of 0
and at most 30% under a clear loss, at the same false-pass rate. The shipped design
(:func:`kvaudit.stats.sequential.design`: O'Brien-Fleming-type pass spending, ten looks, maximum =
the fixed design's size) is compared here with the usual ways to save more: more looks (every 5%
of the fixed size, from 10% or from 30%), a maximum inflated by 10-30% to buy back power, and
spending that passes earlier (the power family ``alpha * t**rho`` with rho = 2, and Pocock-type),
and the futility rule's threshold (conditional power under no difference; 0 = off).
Each design's runs are simulated case by case in shuffled order
(:func:`kvaudit.stats.sequential.simulate`; binary scores, base accuracy 0.8, gain rate 0.05, one
case per document: the ``kvaudit plan`` default) at a true delta of 0, at the margin and 8 points
past it. Columns: power (passes at delta 0), E[n] over the **fixed** size (not the maximum) at
each delta, and the false-pass rate at the margin (promise: alpha = 0.025 + 3 MC SE).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from scipy.stats import norm  # noqa: E402

from kvaudit.stats import sequential as seq  # noqa: E402
from kvaudit.stats.calibration import Design, mc_se  # noqa: E402

ALPHA = 0.025
CLEAR_LOSS = 0.08


def power_spending(rho: float):
    return lambda t, a: 0.0 if t <= 0 else float(a * min(t, 1.0) ** rho)


def plan(max_cases: int, looks: list[int], spending: str, futility: float) -> seq.SequentialDesign:
    fractions = tuple(n / max_cases for n in looks)
    z = seq.boundaries(fractions, ALPHA, spending)
    fail = seq.boundaries(fractions, ALPHA, "pocock")
    return seq.SequentialDesign(max_cases, looks[1] - looks[0] if len(looks) > 1 else max_cases, ALPHA,
                                tuple(looks), tuple(z), tuple(float(norm.sf(c)) if np.isfinite(c) else 0.0 for c in z),
                                tuple(float(norm.sf(c)) if np.isfinite(c) else 0.0 for c in fail), spending=spending,
                                futility=futility)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixed-n", type=int, default=550, help="the fixed design's size for ~80%% power")
    ap.add_argument("--margin", type=float, default=-0.02)
    ap.add_argument("--cluster-size", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    seq.SPENDERS["power-2"] = power_spending(2.0)
    nf, m = args.fixed_n, args.margin
    f = seq.FUTILITY
    rows = [("obrien-fleming", 1.0, 10, 0.1, f), ("obrien-fleming", 1.0, 10, 0.1, 0.0),
            ("obrien-fleming", 1.0, 10, 0.1, 0.1), ("obrien-fleming", 1.0, 10, 0.1, 0.3),
            ("obrien-fleming", 1.0, 20, 0.1, f), ("obrien-fleming", 1.1, 20, 0.1, f),
            ("obrien-fleming", 1.1, 20, 0.1, 0.0), ("power-2", 1.0, 20, 0.1, f), ("pocock", 1.2, 20, 0.1, f)]
    print(f"fixed design {nf} cases, margin {100 * m:+.0f} points, {args.reps} runs per cell "
          f"(MC SE of a rate near alpha {mc_se(ALPHA, args.reps):.3f})")
    print("| spending | futility | max / fixed | looks | first look | power | E[n]/fixed at 0 | at margin | "
          f"at margin-{100 * CLEAR_LOSS:.0f} | false pass |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    fixed_power = None
    for spending, inflate, per, first, futility in rows:
        mx = int(round(nf * inflate))
        step = max(1, nf // per)
        looks = sorted({*range(max(step, int(first * nf)), mx, step), mx})
        p = plan(mx, looks, spending, futility)
        d = Design(n=mx, cluster_size=args.cluster_size, gain_rate=0.05)
        r = {k: seq.simulate(d, m, p, delta, reps=args.reps, seed=args.seed)
             for k, delta in (("zero", 0.0), ("margin", m), ("loss", m - CLEAR_LOSS))}
        if inflate == 1.0 and fixed_power is None:
            fixed_power = r["zero"].fixed_passed
        print(f"| {spending} | {futility:g} | {inflate:.1f} | {len(looks)} | {first:.0%} | {r['zero'].passed:.3f} "
              f"| {r['zero'].mean_cases / nf:.2f} | {r['margin'].mean_cases / nf:.2f} | {r['loss'].mean_cases / nf:.2f} "
              f"| {r['margin'].passed:.3f} |", flush=True)
    print(f"the fixed design's own power on {nf} cases: {fixed_power:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
