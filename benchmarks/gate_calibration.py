"""Is the gate calibrated? The operating characteristic of the shipped non-inferiority bound by
simulation, beside the old percentile cluster bootstrap it replaced.

Run by hand (prints the Markdown table that docs/reports.md quotes)::

    nice -n 10 .venv/bin/python benchmarks/gate_calibration.py [--reps 2000] [--jobs 2] [--fast]

Each row is a :class:`kvaudit.stats.calibration.Design`: cases, cases per document, the share
of cases on two documents, 0/1 or F1-like scores, document heterogeneity (``h = 0.95``: document
multipliers 0.05 or 1.95; ``concentrated``: h = 0.95 with 10% of documents fragile, multiplier
9.55, so most losses sit on a few documents). Runs are simulated
with the true mean difference exactly at the margin (the default policy's -2 points; -5 for
the multi-hop rows) and at 0. Columns, for each gate:

* **false pass**: share of runs at the margin whose gate lower bound clears the margin (the
  promise is at most alpha = 0.025 for the new one-sided 97.5% bound; the target is 0.05 plus
  Monte Carlo error);
* **coverage**: share of decided runs whose two-sided 95% interval holds the true delta;
* **power**: share of runs at a true delta of 0 that pass;
* **undecidable**: share of runs at the margin that give no bound (too few documents, too
  small an effective sample): the gate says "cannot judge" there, which is not a pass.

Each rate is printed with its Monte Carlo standard error. The OLD gate is reimplemented here
from ``git show c59ff12:kvaudit/reports/stats.py`` (:func:`old_gate`): percentile cluster
bootstrap, clusters = exact evidence sets (a case on {A, B} is its own cluster), a rule-of-three
floor on the spread, one-sided 95% lower bound, at least 2 clusters. Both gates see the same
simulated runs (same seed per row; the old gate, being slow, sees the first ``--old-reps``).

The **sequential** gate (``kvaudit run --until-decided``: :mod:`kvaudit.stats.sequential`, max
cases = the row's n, a look every tenth, alpha 0.025, futility 0.2) is judged on the same rows in
a second table, beside the fixed bound on all n cases of the same simulated runs: false pass at the
margin (promise: alpha = 0.025), power at 0, and E[n]/n, the mean share of the n cases it used, at
a true delta of 0, at the margin and under a clear loss (``CLEAR_LOSS`` below the margin);
``--seq-reps`` runs per row and delta (default reps / 2), ``--no-seq`` skips it.

Exit status 1 when any NEW-gate row's false-pass rate exceeds 0.05 + 3 MC SE or its coverage
is below 0.94 - 3 MC SE (MC SE taken at the target rate, so a row cannot pass by being noisy),
or any sequential row's false-pass rate exceeds alpha + 3 MC SE; the failing rows are printed
with the amount. The rows labelled ``(limit)`` are printed but not checked: losses concentrated
on the 2-3 fragile documents a 20-30 document sample is expected to hold, where the sample often holds none (the documented limit of any bound computed from the
sample alone; the old gate failed them as badly).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvaudit.stats.calibration import Characteristic, Design, characterise, mc_se  # noqa: E402
from kvaudit.stats.sequential import (  # noqa: E402
    CLEAR_LOSS,
    SequentialRates,
    default_look_every,
    operating_characteristic,
)
from kvaudit.stats.sequential import design as sequential_design  # noqa: E402

FALSE_PASS_TARGET = 0.05
COVERAGE_TARGET = 0.94
OLD_CONFIDENCE = 0.95  # the old policy's confidence: one-sided lower bound, two-sided interval
SEQ_ALPHA = 0.025  # the sequential gate's false-pass promise (the default policy's one-sided level)


# ----------------------------------------------------------------------------- the old gate

def _old_bootstrap_means(d: np.ndarray, clusters: Sequence[str], n_boot: int, seed: int) -> np.ndarray:
    """``cluster_bootstrap_means`` at c59ff12: resample whole clusters, case-weighted mean."""
    _, inverse = np.unique(np.asarray(clusters), return_inverse=True)
    sums = np.bincount(inverse, weights=d)
    counts = np.bincount(inverse).astype(float)
    idx = np.random.default_rng(seed).integers(0, len(sums), size=(n_boot, len(sums)))
    return sums[idx].sum(axis=1) / counts[idx].sum(axis=1)


def old_gate(diffs: np.ndarray, memberships: Sequence[Sequence[str]],
             confidence: float = OLD_CONFIDENCE, *, n_boot: int = 1000,
             seed: int = 0) -> tuple[float, float, float] | None:
    """The gate before the new bound (``paired_delta`` at c59ff12), as a calibration statistic:
    ``(one-sided lower bound at confidence, two-sided interval at confidence)`` on the [-1, 1]
    scale, None with fewer than 2 clusters. Clusters are exact evidence sets."""
    from scipy.stats import norm

    d = np.asarray(diffs, dtype=float)
    clusters = ["|".join(sorted(map(str, m))) for m in memberships]
    if len(set(clusters)) < 2:
        return None
    boots = _old_bootstrap_means(d, clusters, n_boot, seed)
    n, mean = len(d), float(d.mean())
    floor = float(np.sqrt(min(1.0, 3.0 / n) / n))  # rule of three: SE if 3 in n differed
    tail = (1 - confidence) / 2
    two, one = norm.ppf(1 - tail) * floor, norm.ppf(confidence) * floor
    lower = min(float(np.quantile(boots, 1 - confidence)), mean - one)
    lo = min(float(np.quantile(boots, tail)), mean - two)
    hi = max(float(np.quantile(boots, 1 - tail)), mean + two)
    clip = lambda x: min(1.0, max(-1.0, x))  # noqa: E731
    return clip(lower), clip(lo), clip(hi)


# ----------------------------------------------------------------------------- the grid

@dataclass(frozen=True)
class Row:
    label: str
    design: Design
    margin: float  # on the [-1, 1] scale


def grid() -> list[Row]:
    """The issue's grid, then its finding-4 scenario, multi-hop margins and strong clustering."""
    rows = []
    for score in ("binary", "f1"):
        for n in (50, 200, 1000):
            for cs in (1, 2, 5):
                for multi in (0.0, 0.5):
                    rows.append(Row("grid", Design(n=n, cluster_size=cs, multi_doc_share=multi, score=score), -0.02))
    # finding 4: half the cases two-hop over 30 documents (n * 1.5 / cluster_size = 30)
    rows.append(Row("30 documents", Design(n=1000, cluster_size=50, multi_doc_share=0.5), -0.02))
    rows.append(Row("30 documents", Design(n=200, cluster_size=10, multi_doc_share=0.5), -0.02))
    rows.append(Row("30 documents", Design(n=1000, cluster_size=50, multi_doc_share=0.5, score="f1"), -0.02))
    # the multi-hop group (every case two-hop) at the default policy's -5 points
    rows.append(Row("multi-hop", Design(n=200, cluster_size=5, multi_doc_share=1.0), -0.05))
    rows.append(Row("multi-hop", Design(n=500, cluster_size=500 * 2 / 30, multi_doc_share=1.0), -0.05))
    rows.append(Row("multi-hop", Design(n=200, cluster_size=5, multi_doc_share=1.0, score="f1"), -0.05))
    # strong clustering: document fragility 0.05 or 1.95
    for d in (Design(n=200, cluster_size=5, multi_doc_share=0.5), Design(n=1000, cluster_size=5),
              Design(n=1000, cluster_size=50, multi_doc_share=0.5),
              Design(n=200, cluster_size=5, multi_doc_share=0.5, score="f1")):
        rows.append(Row("h = 0.95", replace(d, heterogeneity=0.95), -0.02))
    # concentrated: h = 0.95 with 10% fragile documents (multiplier 9.55, the rest 0.05), so most
    # losses sit on a few documents; with 30 documents this is where the old gate's coverage falls
    # to about 0.8 (the finding 4)
    # Where about 2-3 fragile documents are expected in the whole sample (20-30 documents with
    # 1000 cases), a sample often holds none and looks clean: no bound from the sample alone can
    # know, so these rows are the documented limit, printed but not part of the exit check.
    for d in (Design(n=200, cluster_size=5, multi_doc_share=0.5), Design(n=1000, cluster_size=5),
              Design(n=1000, cluster_size=50), Design(n=1000, cluster_size=50, multi_doc_share=0.5),
              Design(n=200, cluster_size=10, multi_doc_share=0.5)):
        label = "concentrated" + (" (limit)" if d.n_documents <= 30 and d.n >= 1000 else "")
        rows.append(Row(label, replace(d, heterogeneity=0.95, fragile_share=0.1), -0.02))
    return rows


def gated(row: Row) -> bool:
    """Rows the exit status checks: all but the documented limit."""
    return not row.label.endswith("(limit)")


def _run(job: tuple[int, Row, str, int, int, int]) -> tuple[int, str, Any, float]:
    i, row, gate, reps, seed, n_boot = job
    t = time.perf_counter()
    if gate == "seq":
        plan = sequential_design(row.design.n, default_look_every(row.design.n), SEQ_ALPHA)
        c: Any = operating_characteristic(row.design, row.margin, plan, reps=reps, seed=seed)
    else:
        statistic = None if gate == "new" else partial(old_gate, n_boot=n_boot)
        c = characterise(row.design, row.margin, reps=reps, seed=seed, statistic=statistic)
    return i, gate, c, time.perf_counter() - t


# ----------------------------------------------------------------------------- output

def _rate(x: float | None, reps: int) -> str:
    return "n/a" if x is None else f"{x:.3f} ± {mc_se(x, max(reps, 1)):.3f}"


def _design(d: Design) -> str:
    multi = "single" if d.multi_doc_share == 0 else f"{d.multi_doc_share:.0%} two-doc"
    return f"{d.score} | {d.n} | {d.cluster_size:g} | {multi} | {d.n_documents}"


def check_new(c: Characteristic) -> list[str]:
    """Why a new-gate row misses the targets (empty when it meets them)."""
    out = []
    m, reps = c.at_margin, c.at_margin.reps
    fp_limit = FALSE_PASS_TARGET + 3 * mc_se(FALSE_PASS_TARGET, reps)
    if m.passed > fp_limit:
        out.append(f"false pass {m.passed:.3f} > {fp_limit:.3f} (by {m.passed - fp_limit:.3f})")
    if m.covered is not None:
        cov_limit = COVERAGE_TARGET - 3 * mc_se(COVERAGE_TARGET, max(m.decided, 1))
        if m.covered < cov_limit:
            out.append(f"coverage {m.covered:.3f} < {cov_limit:.3f} (by {cov_limit - m.covered:.3f})")
    return out


def table(rows: list[Row], new: dict[int, Characteristic], old: dict[int, Characteristic]) -> str:
    head = ("| scenario | score | n | cases/doc | documents per case | docs | margin "
            "| **new** false pass | new coverage | new power at 0 | new undecidable "
            "| old false pass | old coverage | old power at 0 | old undecidable | new meets target |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for i, r in enumerate(rows):
        c = new[i]
        cells = [r.label, _design(r.design), f"{100 * r.margin:+.0f}",
                 f"**{_rate(c.at_margin.passed, c.at_margin.reps)}**",
                 _rate(c.at_margin.covered, c.at_margin.decided),
                 _rate(c.at_zero.passed, c.at_zero.reps), f"{c.at_margin.undecidable:.3f}"]
        o = old.get(i)
        if o is None:
            cells += ["-"] * 4
        else:
            cells += [_rate(o.at_margin.passed, o.at_margin.reps), _rate(o.at_margin.covered, o.at_margin.decided),
                      _rate(o.at_zero.passed, o.at_zero.reps), f"{o.at_margin.undecidable:.3f}"]
        cells.append(("yes" if not check_new(c) else "**NO**") + ("" if gated(r) else " (limit)"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_seq(c: dict[str, SequentialRates | None]) -> list[str]:
    """Why a sequential row misses its promise: false pass at the margin <= alpha + 3 MC SE."""
    m = c["margin"]
    if m is None:
        return []
    limit = SEQ_ALPHA + 3 * mc_se(SEQ_ALPHA, m.reps)
    return [f"sequential false pass {m.passed:.3f} > {limit:.3f} (by {m.passed - limit:.3f})"] if m.passed > limit else []


def seq_table(rows: list[Row], seq: dict[int, dict[str, SequentialRates | None]]) -> str:
    head = ("| scenario | score | n | cases/doc | documents per case | docs | margin "
            "| **sequential** false pass | fixed false pass | sequential power at 0 | fixed power at 0 "
            f"| E[n]/n at 0 | at the margin | at margin-{100 * CLEAR_LOSS:.0f} | meets alpha + 3 SE |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for i, r in enumerate(rows):
        c = seq[i]
        m, z, lo = c["margin"], c["zero"], c["loss"]
        n = r.design.n
        cells = [r.label, _design(r.design), f"{100 * r.margin:+.0f}",
                 f"**{_rate(m and m.passed, m.reps if m else 0)}**", _rate(m and m.fixed_passed, m.reps if m else 0),
                 _rate(z and z.passed, z.reps if z else 0), _rate(z and z.fixed_passed, z.reps if z else 0),
                 "n/a" if z is None else f"{z.mean_cases / n:.2f}", "n/a" if m is None else f"{m.mean_cases / n:.2f}",
                 "n/a" if lo is None else f"{lo.mean_cases / n:.2f}",
                 ("yes" if not check_seq(c) else "**NO**") + ("" if gated(r) else " (limit)")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000,
                    help="simulated runs per row and true delta for the new gate (default 2000: "
                         "MC SE of a 5%% rate about 0.5%%)")
    ap.add_argument("--old-reps", type=int, default=None,
                    help="runs per row for the old gate (default reps / 4)")
    ap.add_argument("--old-boot", type=int, default=1000, help="old gate's bootstrap resamples (default 1000)")
    ap.add_argument("--no-old", action="store_true", help="skip the old gate")
    ap.add_argument("--seq-reps", type=int, default=None,
                    help="runs per row and true delta for the sequential gate (default reps / 2)")
    ap.add_argument("--no-seq", action="store_true", help="skip the sequential gate")
    ap.add_argument("--fast", action="store_true", help="300 runs (old gate 100 with 500 resamples): a quick look")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.fast:
        args.reps, args.old_reps, args.old_boot = min(args.reps, 300), 100, 500
    old_reps = args.old_reps if args.old_reps is not None else max(args.reps // 4, 1)
    seq_reps = args.seq_reps if args.seq_reps is not None else max(args.reps // 2, 1)
    if args.reps < 1 or old_reps < 1 or seq_reps < 1 or args.old_boot < 100 or args.jobs < 1:
        ap.error("--reps, --old-reps and --seq-reps must be >= 1, --old-boot >= 100, --jobs >= 1")

    rows = grid()
    jobs = [(i, r, "new", args.reps, args.seed + 10 * i, 0) for i, r in enumerate(rows)]
    if not args.no_old:
        jobs += [(i, r, "old", old_reps, args.seed + 10 * i, args.old_boot) for i, r in enumerate(rows)]
    if not args.no_seq:
        jobs += [(i, r, "seq", seq_reps, args.seed + 10 * i + 5, 0) for i, r in enumerate(rows)]
    t0 = time.perf_counter()
    results: dict[str, dict[int, Any]] = {"new": {}, "old": {}, "seq": {}}
    spent = {"new": 0.0, "old": 0.0, "seq": 0.0}
    if args.jobs == 1:
        done = map(_run, jobs)
    else:
        pool = ProcessPoolExecutor(max_workers=args.jobs)
        done = pool.map(_run, jobs)
    for i, gate, c, secs in done:
        results[gate][i] = c
        spent[gate] += secs
        at_margin = c["margin"] if gate == "seq" else c.at_margin
        fp = "n/a" if at_margin is None else f"{at_margin.passed:.3f}"
        print(f"  {gate} {i + 1}/{len(rows)} {rows[i].label} {_design(rows[i].design)}: "
              f"false pass {fp}, {secs:.0f}s", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0

    print(f"Gate calibration: {args.reps} runs per row and true delta (new gate), "
          f"{'not run' if args.no_old else f'{old_reps} with {args.old_boot} bootstrap resamples'} "
          f"(old gate), {'not run' if args.no_seq else seq_reps} (sequential gate); seed {args.seed}; "
          f"{wall:.0f}s wall on {args.jobs} process(es) "
          f"(new {spent['new']:.0f}s, old {spent['old']:.0f}s, sequential {spent['seq']:.0f}s CPU); "
          f"{os.cpu_count()} CPUs.\n")
    print("New: score bound, document design effect, t with G-1 df, one-sided 97.5% (lower end of the "
          "two-sided 95% interval). Old: percentile cluster bootstrap, exact evidence sets, rule-of-three "
          "floor, one-sided 95%. Rates ± Monte Carlo SE; coverage is of the two-sided 95% interval at "
          "the margin; power is the pass rate at a true delta of 0.\n")
    print(table(rows, results["new"], results["old"]))
    limit = [i for i, r in enumerate(rows) if not gated(r)]
    if limit:
        print("\nLimit rows (not in the exit check; see kvaudit.stats.noninferiority): "
              + "; ".join(f"row {i + 1} false pass {results['new'][i].at_margin.passed:.3f}" for i in limit))
    failures = [(i, why) for i in range(len(rows)) if gated(rows[i]) for why in check_new(results["new"][i])]
    if not args.no_seq:
        print(f"\nSequential gate (kvaudit run --until-decided, max = n, a look every n/10, alpha {SEQ_ALPHA}, "
              "futility 0.2) on the same rows; fixed = the shipped bound on all n cases of the same simulated runs; "
              f"E[n]/n = mean cases used over n at a true delta of 0, at the margin and {100 * CLEAR_LOSS:.0f} "
              "points below it.\n")
        print(seq_table(rows, results["seq"]))
        failures += [(i, why) for i in range(len(rows)) if gated(rows[i]) for why in check_seq(results["seq"][i])]
    if failures:
        print(f"\nMISSES THE TARGET (new gate: false pass <= {FALSE_PASS_TARGET} + 3 MC SE, coverage >= "
              f"{COVERAGE_TARGET} - 3 MC SE; sequential: false pass <= {SEQ_ALPHA} + 3 MC SE) in "
              f"{len({i for i, _ in failures})} row(s):")
        for i, why in failures:
            print(f"- row {i + 1} ({rows[i].label}: {_design(rows[i].design)}, margin "
                  f"{100 * rows[i].margin:+.0f}): {why}")
        return 1
    print(f"\nEvery gated row meets the target (new gate: false pass <= {FALSE_PASS_TARGET} + 3 MC SE, "
          f"coverage >= {COVERAGE_TARGET} - 3 MC SE; sequential: false pass <= {SEQ_ALPHA} + 3 MC SE).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
