"""The security probes of a server run, as the report and the gate show them.

* **Tenant isolation** (:func:`kvaudit.audit.checks.server.isolation_results`): per probe, the
  same tenant's repeat must be served from the cache and another tenant's identical request
  must not.
* **Timing side channel**: time to first token of a cache hit (the same tenant's warm request;
  for segment reuse the reuse arm) against a miss (the other tenant's identical request right
  after), one pair per case, as a ROC AUC with its interval (clustered by case, or by batch where
  cases ran several at a time) and the number of request pairs an observer needs to tell them apart (:func:`kvaudit.stats.timing.timing_auc`).
* **Cold / flushed / warm**: per case, the engine's prefix-cache arms' answers: a flushed answer
  that differs from the cold one is the engine's own nondeterminism (both were computed from
  scratch); a warm answer that differs from both cold ones is the cache.
"""

from __future__ import annotations

from typing import Any

from kvaudit.audit.checks.server import isolation_results, probe_arms
from kvaudit.core.arms import arm_for, arms_where
from kvaudit.core.run_format import PairRecord, case_batches, flipped
from kvaudit.stats.timing import TimingAUC, timing_auc


def probe_ttfts(pairs: list[PairRecord], what: str) -> tuple[list[float], list[float], list[str | None]]:
    """(hit, miss, batch) per case of the tenant probe ``what`` ("prefix cache" or "segment
    reuse"): TTFTs, and the batch the case ran in (``PairRecord.batch``; None one at a time)."""
    hit, miss, batch = [], [], []
    for w, same_arm, probe_arm in probe_arms(pairs):
        if w != what:
            continue
        for p in pairs:
            if same_arm in p.arms and probe_arm in p.arms:
                hit.append(p.arms[same_arm].ttft_s)
                miss.append(p.arms[probe_arm].ttft_s)
                batch.append(p.batch)
    return hit, miss, batch


def timing_probes(pairs: list[PairRecord], confidence: float, concurrent_cases: int = 1) -> dict[str, TimingAUC]:
    """``{what: TimingAUC}`` of hit against miss TTFT for each tenant probe that ran. Where the
    cases ran together the interval clusters by batch (:func:`~kvaudit.core.run_format.case_batches`);
    without every case's batch, or with one batch only, it is marked unjudged."""
    out = {}
    for what, _, _ in probe_arms(pairs):
        hit, miss, batch = probe_ttfts(pairs, what)
        if len(hit) < 2:
            continue
        labels, unrecorded = case_batches(batch, concurrent_cases)
        if unrecorded:
            out[what] = timing_auc(hit, miss, confidence, unjudged=unrecorded)
        elif labels is not None and len(set(labels)) < 2:
            out[what] = timing_auc(hit, miss, confidence, unjudged="every case ran in one batch: nothing to "
                                                                   "compare it with")
        else:
            out[what] = timing_auc(hit, miss, confidence, batches=labels)
    return out


def cold_flushed_warm(pairs: list[PairRecord]) -> dict[str, Any] | None:
    """Counts of cases by where their prefix-cache answers differ, or ``None`` when the three
    arms did not all run."""
    cold, warm = arm_for("engine_prefix"), arm_for("engine_prefix_warm")
    flushed = arms_where(role="engine_prefix_flushed")
    if not flushed:
        return None
    flushed_arm = flushed[0]
    rows = [p for p in pairs if all(a in p.arms for a in (cold, flushed_arm, warm))]
    if not rows:
        return None
    counts = {"stable": 0, "engine": 0, "cache": 0, "both": 0}
    cases: dict[str, list[str]] = {k: [] for k in counts}
    for p in rows:
        c, f, w = p.arms[cold], p.arms[flushed_arm], p.arms[warm]
        engine = flipped(f, c)
        cache = flipped(w, c) and flipped(w, f)
        key = "both" if engine and cache else "engine" if engine else "cache" if cache else "stable"
        counts[key] += 1
        cases[key].append(p.case_id)
    return {"n": len(rows), "arms": [cold, flushed_arm, warm], "counts": counts,
            "cases": {k: v[:10] for k, v in cases.items()}}


def security_summary(pairs: list[PairRecord], timing: dict[str, TimingAUC]) -> dict[str, Any]:
    """Everything the report's security section shows (empty lists where no probe ran), from the
    pairs and their :func:`timing_probes`."""
    iso = isolation_results(pairs)
    return {
        "isolation": [{"what": w, "verdict": r.verdict, "n": r.n, "leaked": list(r.leaked[:10]),
                       "reason": r.reason} for w, r in iso.items()],
        "timing": [{"what": w, **_timing_row(t)} for w, t in timing.items()],
        "cold_flushed_warm": cold_flushed_warm(pairs),
    }


def _timing_row(t: TimingAUC) -> dict[str, Any]:
    return {"n": t.n, "batches": t.batches, "unjudged": t.unjudged, "auc": t.auc, "lower": t.lower, "upper": t.upper, "confidence": t.confidence,
            "paired_accuracy": t.paired_accuracy, "median_hit_s": t.median_hit, "median_miss_s": t.median_miss,
            "requests_needed": t.requests_needed, "requests_needed_best_case": t.requests_needed_best_case,
            "error": t.error}
