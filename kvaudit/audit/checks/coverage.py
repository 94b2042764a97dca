"""Coverage: how well the run's cases exercise reuse dynamics (reported, not required).

Minimums: :data:`MIN_REFS_PER_SEGMENT` mean references per segment and
:data:`MIN_NEVER_CACHED_SHARE` of occurrences at never-cached positions.
"""

from __future__ import annotations

from kvaudit.audit.checks.base import check, fmt, result
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.core.coverage import compute_coverage

MIN_REFS_PER_SEGMENT = 2.0
MIN_NEVER_CACHED_SHARE = 0.5


def _mean(cov: dict, key: str) -> object:
    """``cov[key]["mean"]``, or None where it is not recorded (coverage is the generator's own dict)."""
    d = cov.get(key)
    return d.get("mean") if isinstance(d, dict) else None


def _coverage(run: LoadedRun) -> tuple[dict | None, str]:
    if run.dataset is not None:
        ids = {p.case_id for p in run.pairs}
        cases = [c for c in run.dataset.cases if c.id in ids]
        return compute_coverage(run.dataset.segments, cases), f"computed from {run.dataset.path}"
    cov = run.manifest.dataset.coverage if run.manifest.dataset else None
    if cov:
        return cov, "from the dataset card"
    return None, run.dataset_note


@check("coverage", required=False, scope="reuse")
def check_coverage(run: LoadedRun):
    """Reuse-dynamics coverage of the run's cases; warns below the minimums (not required)."""
    cov, where = _coverage(run)
    if cov is None:
        why = f" ({where})" if where else ""
        return result(True, f"no reuse-dynamics coverage recorded{why}",
                      warning="coverage unknown: pass --dataset DIR to compute it")
    refs = _mean(cov, "refs_per_segment")
    share = cov.get("never_cached_position_share")
    warnings = [str(w) for w in cov.get("warnings", []) if w] if isinstance(cov.get("warnings"), list) else []
    if isinstance(refs, (int, float)) and refs < MIN_REFS_PER_SEGMENT:
        warnings.append(f"mean references per segment {refs:.2g} < {MIN_REFS_PER_SEGMENT:g}")
    if isinstance(share, (int, float)) and share < MIN_NEVER_CACHED_SHARE:
        warnings.append(f"share at never-cached positions {share:.2g} < {MIN_NEVER_CACHED_SHARE:g}")
    orders = _mean(cov, "distinct_orders_per_segment")
    detail = (f"{where}: mean references per segment {fmt(refs)}, distinct orders per segment "
              f"{fmt(orders)}, share at never-cached positions {fmt(share)}, "
              f"foreign-context share {fmt(cov.get('foreign_context_share'))}")
    return result(True, detail, [], "; ".join(warnings) or None)
