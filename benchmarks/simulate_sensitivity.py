"""Headline numbers of the default workload next to the published ones, and a sensitivity table.

Run by hand; prints the markdown that docs/simulator.md quotes::

    .venv/bin/python benchmarks/simulate_sensitivity.py [--seeds 3] [--headline-seeds 10]

Every row changes one workload parameter (or the capacity) from the defaults of
``kvaudit generate workload`` and reports token hit rates for GPT-OSS-120B's KV shape, averaged
over ``--seeds`` seeds.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvaudit.generators.workload import WorkloadParams, generate  # noqa: E402
from kvaudit.simulator.kv_bytes import parse_capacity, resolve_model  # noqa: E402
from kvaudit.simulator.prefix_cache import simulate_prefix  # noqa: E402
from kvaudit.simulator.segment_cache import simulate_segment  # noqa: E402

PUBLISHED = {"segment@30GB": 0.639, "prefix@30GB": 0.033, "prefix@1TB": 0.179}
BPT = resolve_model("gpt-oss-120b").bytes_per_token

SWEEP: list[tuple[str, str, list]] = [
    ("zipf", "zipf", [0.4, 0.65, 0.8, 1.0, 1.2]),
    ("docs per request", "docs_per_request", [3, 5, 10, 20]),
    ("shared-prefix share", "shared_prefix_share", [0.0, 0.2, 0.5, 0.8, 1.0]),
    ("query pool (0 = all fresh)", "queries", [10, 38, 100, 1000, 0]),
    ("document tokens", "doc_tokens", ["lognormal:500:0.5", "lognormal:2000:0.5", "lognormal:4000:0.5"]),
]
CAPACITIES = ["3GB", "10GB", "30GB", "100GB", "300GB", "1TB"]


def rates(params: WorkloadParams, runs: list[tuple[str, str]]) -> dict[str, float]:
    tr = generate(params)
    total = tr.request_tokens().sum()
    out = {}
    for policy, cap in runs:
        tokens = parse_capacity(cap) // BPT
        hits = simulate_segment(tr, tokens)[0] if policy == "segment" else simulate_prefix(tr, tokens)
        out[f"{policy}@{cap}"] = hits.sum() / total
    return out


def averaged(params: WorkloadParams, runs: list[tuple[str, str]], seeds: int) -> dict[str, tuple[float, float]]:
    per_seed = [rates(replace(params, seed=s), runs) for s in range(seeds)]
    return {k: (float(np.mean([r[k] for r in per_seed])), float(np.std([r[k] for r in per_seed])))
            for k in per_seed[0]}


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds averaged per sensitivity row")
    ap.add_argument("--headline-seeds", type=int, default=10)
    args = ap.parse_args()
    t0 = time.perf_counter()
    base = WorkloadParams()
    heads = [("segment", "30GB"), ("prefix", "30GB"), ("prefix", "1TB")]

    seed0 = rates(base, heads)
    many = averaged(base, heads, args.headline_seeds)
    print("## Headline numbers (defaults, GPT-OSS-120B KV)\n")
    print(f"| token hit rate | published | kvaudit, seed 0 | kvaudit, mean ± sd over {args.headline_seeds} seeds |")
    print("|---|---|---|---|")
    for key, pub in PUBLISHED.items():
        m, sd = many[key]
        print(f"| {key.replace('@', ' at ')} | {pct(pub)}% | {pct(seed0[key])}% | {pct(m)}% ± {pct(sd)} |")

    print(f"\n## Sensitivity (one parameter changed from the defaults; mean of {args.seeds} seeds)\n")
    print("| parameter | value | segment at 30GB | prefix at 30GB | gap (points) | prefix at 1TB |")
    print("|---|---|---|---|---|---|")
    for label, field, values in SWEEP:
        for v in values:
            r = averaged(replace(base, **{field: v}), heads, args.seeds)
            mark = " (default)" if getattr(base, field) == v else ""
            gap = r["segment@30GB"][0] - r["prefix@30GB"][0]
            print(f"| {label} | {v}{mark} | {pct(r['segment@30GB'][0])}% | {pct(r['prefix@30GB'][0])}% | "
                  f"{pct(gap)} | {pct(r['prefix@1TB'][0])}% |")

    print(f"\n## Capacity (default workload; mean of {args.seeds} seeds)\n")
    runs = [(p, c) for c in CAPACITIES for p in ("segment", "prefix")]
    r = averaged(base, runs, args.seeds)
    print("| capacity | KV tokens | segment | prefix | gap (points) |")
    print("|---|---|---|---|---|")
    for c in CAPACITIES:
        s, p = r[f"segment@{c}"][0], r[f"prefix@{c}"][0]
        print(f"| {c} | {parse_capacity(c) // BPT:,} | {pct(s)}% | {pct(p)}% | {pct(s - p)} |")
    print(f"\n(computed in {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
