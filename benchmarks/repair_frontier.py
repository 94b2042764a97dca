"""The repairs' frontier of a run as Markdown tables (docs/repairs.md, benchmarks/RESULTS.md).

    kvaudit demo --repairs --out runs/frontier          # or kvaudit run --arms <REPAIR_SWEEP> + report
    python benchmarks/repair_frontier.py runs/frontier/run [--policy FILE]

Reads the run through the report's own code (:func:`kvaudit.reports.frontier.build_frontier`,
so the numbers are the report's) and prints: per group (overall, then each task family) one row
per frontier arm with n, delta and interval (points), whether it is non-inferior at the policy's
margin, recomputed-token share, median TTFT, speed-up over recompute and the selection step's
median; the routing line per group; the repair controls' audit rows; and the oracle split.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _pts(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1f}"


def _ci(ci: list[float] | None) -> str:
    return "–" if not ci else f"[{ci[0]:+.1f}, {ci[1]:+.1f}]"


def tables(run_dir: Path, policy_path: str | None = None) -> str:
    from kvaudit.reports.analysis import Analysis, load_run
    from kvaudit.reports.frontier import build_frontier
    from kvaudit.reports.policy import load_policy

    policy = load_policy(policy_path)
    run = load_run(run_dir)
    an = Analysis(run, confidence=policy.confidence, min_icc=policy.min_icc)
    f = build_frontier(an, policy)
    out = ["| group | arm | n | delta (pts) | 95% interval | non-inferior | recomputed | median TTFT | speed-up | selection |",
           "|---|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for g in f["groups"]:
        for i, p in enumerate(g["points"]):
            share = "–" if p["recomputed_share"] is None else f"{100 * p['recomputed_share']:.1f}%"
            sel = "–" if p["select_median"] is None else f"{1000 * p['select_median']:.1f} ms"
            out.append(f"| {g['group'] if i == 0 else ''} | `{p['arm']}` | {p['n']} | {_pts(p['delta'])} | "
                       f"{_ci(p['ci'])} | {'yes' if p['non_inferior'] else 'no'} | {share} | "
                       f"{1000 * p['ttft_median']:.0f} ms | {p['speedup']:.2f}x | {sel} |")
    out += ["", "| group | margin | cheapest non-inferior arm | why |", "|---|---:|---|---|"]
    for g in f["groups"]:
        out.append(f"| {g['group']} | {_pts(g['margin'])} | {g['route']['arm'] or 'none'} | {g['route']['reason']} |")
    if f["oracle"]:
        out += ["", "| group | n | reuse vs recompute | oracle vs oracle_recompute (missing cross-attention) | "
                    "difference (distractors) | oracle_recompute vs recompute |", "|---|---:|---|---|---:|---|"]
        for r in f["oracle"]:
            out.append(f"| {r['group']} | {r['n']} | {_pts(r['reuse_delta'])} {_ci(r['reuse_ci'])} | "
                       f"{_pts(r['oracle_delta'])} {_ci(r['oracle_ci'])} | {_pts(r['distractor_part'])} | "
                       f"{_pts(r['model_distractor_delta'])} {_ci(r['model_distractor_ci'])} |")
    audit = run.audit
    rows = [c for c in (audit.checks or []) if c.get("name", "").startswith("repair_") or
            c.get("name") in ("identity_control", "reuse_happened")]
    if rows:
        out += ["", "| audit check | result | detail |", "|---|---|---|"]
        out += [f"| `{c['name']}` | {'pass' if c['passed'] else 'FAIL'} | {c.get('detail', '')} |" for c in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--policy", default=None)
    args = ap.parse_args()
    print(tables(args.run_dir, args.policy))


if __name__ == "__main__":
    main()
