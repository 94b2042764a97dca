"""The per-case console summary of a run, for any backend (printed by ``kvaudit run``)."""

from __future__ import annotations

from pathlib import Path

from kvaudit.core.arms import REFERENCE_ARM, UNDER_TEST_ARM
from kvaudit.core.errors import printable
from kvaudit.core.manifest import Manifest
from kvaudit.core.run_dir import RunDir


def print_run_summary(run_dir: Path, manifest: Manifest, max_rows: int = 200) -> None:
    """Per case and arm: answer, first-token margin, TTFT and reused tokens (case ids, arm names
    and answers escaped: they come from the dataset and the model)."""
    run = RunDir(run_dir)
    pairs = run.read_pairs()
    print(f"\n{'case':<18} {'arm':<17} {'margin':>7} {'ttft_s':>7} {'reused':>6} {'dlogit':>8}  answer")
    for rec in pairs[:max_rows]:
        for name in rec.arm_order:
            r = rec.arms[name]
            d = "" if r.logit_diff_vs_recompute is None else f"{r.logit_diff_vs_recompute:.2e}"
            ans = printable(r.answer.replace("\n", " "))[:60]
            print(f"{printable(rec.case_id)[:18]:<18} {printable(name):<17} {r.margin:7.3f} {r.ttft_s:7.3f} {r.tokens_reused:6d} {d:>8}  {ans}")
    if len(pairs) > max_rows:
        print(f"... {len(pairs) - max_rows} more cases in {printable(run.pairs_file)}")
    t = manifest.timing_s or {}
    # the parts this run has (a serving-change run has a candidate and no reuse or caching)
    names = {"caching": "one-time caching"}
    parts = [f"{names.get(k, k)} {t[k]:.1f}s" for k in (REFERENCE_ARM, UNDER_TEST_ARM, "candidate", "repairs",
                                                          "controls", "caching") if t.get(k)]
    print(f"\n{len(pairs)} cases in {printable(run_dir)}; wall {t.get('wall', 0):.1f}s ({', '.join(parts)})")
