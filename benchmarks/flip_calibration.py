"""Operating characteristic of the gate's ``[flips] max_rate`` threshold, by simulation (run by hand).

    .venv/bin/python benchmarks/flip_calibration.py [--reps 2000] [--seed 0]

The threshold judges how often an arm's answer differs from recompute's: it passes when the upper
end of the flip rate's two-sided interval (:func:`kvaudit.stats.noninferiority.paired_bound` on 0/1
flips, one-sided 97.5%, with the documents' design effect) is at most ``max_rate``. Flips cluster by
document (a document the model reads differently under reuse flips several of its questions), so
cases are drawn ``m`` per document with a per-document flip probability from a Beta of mean ``p``
and intra-document correlation ``rho`` (beta-binomial).

Printed per cell: the false-pass rate at the boundary (true rate = ``max_rate``), which must stay
at or under the one-sided level 2.5% plus 3 Monte Carlo SE, with the same rate for a bound that
ignores the documents (every case its own document) beside it, and the power at half the
threshold. Cells that give no bound (too few documents) are counted as not passing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvaudit.stats.calibration import mc_se  # noqa: E402
from kvaudit.stats.noninferiority import paired_bound  # noqa: E402

ALPHA_ONE_SIDED = 0.025


def draw_flips(p: float, n_docs: int, per_doc: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """0/1 flips, ``per_doc`` cases on each of ``n_docs`` documents, beta-binomial at mean ``p``."""
    if rho <= 0:
        probs = np.full(n_docs, p)
    else:
        a, b = p * (1 - rho) / rho, (1 - p) * (1 - rho) / rho
        probs = rng.beta(a, b, n_docs)
    return (rng.random((n_docs, per_doc)) < probs[:, None]).astype(float).ravel()


def pass_rate(p: float, max_rate: float, n_docs: int, per_doc: int, rho: float, reps: int, seed: int, *,
              ignore_documents: bool = False) -> float:
    """Share of simulated runs whose flip threshold passes (upper bound at most ``max_rate``)."""
    rng = np.random.default_rng(seed)
    docs = [[f"d{i}"] for i in range(n_docs) for _ in range(per_doc)]
    if ignore_documents:
        docs = [[f"c{j}"] for j in range(n_docs * per_doc)]
    passed = 0
    for _ in range(reps):
        b = paired_bound(draw_flips(p, n_docs, per_doc, rho, rng), docs)
        passed += bool(b.decidable and b.upper is not None and b.upper <= max_rate)
    return passed / reps


CELLS = [  # max_rate, documents, cases per document, rho
    (0.05, 100, 1, 0.0), (0.05, 80, 5, 0.1),
    (0.10, 50, 2, 0.0), (0.10, 40, 5, 0.2), (0.10, 20, 10, 0.2),
    (0.20, 30, 3, 0.1), (0.20, 100, 4, 0.3),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(f"{'max':>5} {'docs':>4} {'m':>3} {'rho':>4}  false pass (SE)   ignoring documents   power at max/2")
    worst = 0.0
    for i, (mx, g, m, rho) in enumerate(CELLS):
        fp = pass_rate(mx, mx, g, m, rho, args.reps, args.seed + i)
        naive = pass_rate(mx, mx, g, m, rho, args.reps, args.seed + i, ignore_documents=True)
        power = pass_rate(mx / 2, mx, g, m, rho, args.reps, args.seed + 100 + i)
        ok = fp <= ALPHA_ONE_SIDED + 3 * mc_se(ALPHA_ONE_SIDED, args.reps)
        worst = max(worst, fp)
        print(f"{mx:>5.2f} {g:>4} {m:>3} {rho:>4.1f}  {fp:6.3f} ({mc_se(fp, args.reps):.3f}){'' if ok else ' OVER'}"
              f"      {naive:6.3f}            {power:6.3f}", flush=True)
    print(f"worst false-pass rate {worst:.3f} against the one-sided level {ALPHA_ONE_SIDED}; "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
