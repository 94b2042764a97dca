"""What every export of a run shares: the per-case records and the run-level numbers.

:func:`sample_rows` writes the per-case records in the lm-evaluation-harness samples style
(``RUN/samples.jsonl``, written by :mod:`kvaudit.reports.report`; the exporters
:mod:`kvaudit.reports.export_inspect` and :mod:`kvaudit.reports.export_lm_eval` read the same rows).
One line per case::

    {"doc_id", "task", "prompt_hash", "doc_hash", "target", "target_hash",
     "resps": {arm: answer}, "filtered_resps": {arm: normalised answer},
     "metrics": {arm: {each of scoring.SCORE_METRICS, "score"}},
     "flips": {arm: bool}, "logit_diff": {arm: float}, "strata": {...}, "metric": str}

``prompt_hash`` is ``PairRecord.ids_hash`` (the canonical token ids every arm consumed);
``doc_hash`` is the SHA-256 of the case's segment ids joined by commas, in prompt order;
``target`` is the gold answers, or the recompute answer for agreement cases.

The run-level helpers read what both exporters report from the manifest (session times, model
and backend, dtype, library versions) and from the analysis (per-arm means and the report's
per-arm metrics).
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timezone
from typing import Any

from kvaudit.core.arms import REFERENCE_ARM
from kvaudit.core.jsonio import sha256_hex
from kvaudit.core.manifest import Manifest
from kvaudit.reports.analysis import Analysis
from kvaudit.reports.scoring import SCORE_METRICS, normalize_answer, references

SCORE_KEYS = ("score", *SCORE_METRICS)  # a sample row's metrics, as the exporters list them


def doc_hash(segment_ids: list[str]) -> str:
    return sha256_hex(",".join(segment_ids))


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def sample_rows(an: Analysis) -> list[dict[str, Any]]:
    rows = []
    for p in an.run.pairs:
        target = references(p) or []
        metrics, flips, diffs = {}, {}, {}
        for arm in p.arms:
            r = an.rows[(p.case_id, arm)]
            metrics[arm] = {m: _num(r[m]) for m in (*SCORE_METRICS, "score")}
            if arm != REFERENCE_ARM:
                flips[arm] = bool(r["flip"]) if r["flip"] is not None else None
                diffs[arm] = _num(r["logit_diff"])
        rows.append({
            "doc_id": p.case_id, "task": p.task, "metric": p.metric,
            "prompt_hash": p.ids_hash, "doc_hash": doc_hash(p.segment_ids),
            "target": target, "target_hash": sha256_hex("\n".join(target)),
            "resps": {a: r.answer for a, r in p.arms.items()},
            "filtered_resps": {a: normalize_answer(r.answer) for a, r in p.arms.items()},
            "metrics": metrics, "flips": flips, "logit_diff": diffs, "strata": p.strata,
        })
    return rows


# --------------------------------------------------------------------------- run-level, for the exporters


def number(v: Any) -> float | None:
    """``v`` as a float; ``None`` for ``None``, a bool, a non-number or NaN."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def run_times(manifest: Manifest) -> tuple[datetime | None, datetime | None]:
    """The first session's start and the last recorded session time, in UTC."""
    stamps: list[datetime] = []
    for s in manifest.sessions:
        for v in (s.started, s.finished):
            try:
                stamps.append(datetime.strptime(str(v), "%Y-%m-%dT%H:%M:%S%z").astimezone(timezone.utc))
            except ValueError:
                continue
    return (stamps[0], stamps[-1]) if stamps else (None, None)


def model_and_backend(manifest: Manifest) -> tuple[str, str]:
    """``(model name, backend)`` as the manifest records them."""
    ident = manifest.identity
    name = (manifest.model.name if manifest.model else None) or (ident.model if ident else None) or "unknown"
    backend = (manifest.backend or {}).get("backend") or (ident.backend if ident else None) or "unknown"
    return str(name), str(backend)


def run_dtype(manifest: Manifest) -> str | None:
    """The run's dtype (a top-level ``dtype`` is what synthetic runs recorded before the manifest
    had a format)."""
    dtype = manifest.extra.get("dtype") or (manifest.model.dtype if manifest.model else None)
    return None if dtype is None else str(dtype)


def identity_values(manifest: Manifest) -> dict[str, Any]:
    """The identity's recorded values (``{}`` when the manifest has no identity)."""
    return {k: v for k, v in manifest.identity.values().items() if v is not None} if manifest.identity else {}


def arm_means(an: Analysis, group: str = "overall") -> dict[str, dict[str, Any]]:
    """Per arm: mean score, its standard error and n over ``group``'s cases the arm ran."""
    # in case order: a set's order, and so the sums' last digits, would vary from process to process
    ids = list(dict.fromkeys(an.select(group)))
    out = {}
    for arm in an.arms:
        vals = [v for v in (number(an.rows[(c, arm)]["score"]) for c in ids if (c, arm) in an.rows)
                if v is not None]
        n = len(vals)
        mean = sum(vals) / n if n else None
        se = (math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1) / n) if n > 1 and mean is not None else None)
        out[arm] = {"n": n, "mean": mean, "stderr": se}
    return out


def arm_metrics(an: Analysis) -> dict[str, dict[str, float]]:
    """The report's per-arm numbers over ``overall``: mean score (0-1) and its SE, then for each
    compared arm the paired delta against recompute and its bounds (points), flip rate, token
    hit rate, median TTFT (s) and TTFT speed-up (ratio of medians). ``None`` values are left out."""
    means = arm_means(an)
    out: dict[str, dict[str, float]] = {}
    for arm in an.arms:
        m: dict[str, Any] = {"mean": means[arm]["mean"], "stderr": means[arm]["stderr"],
                             "n": means[arm]["n"]}
        if arm != an.arms[0]:
            d = an.delta(arm)
            m.update(delta_pts=d.delta, delta_lower_bound_pts=d.lower_bound,
                     delta_upper_bound_pts=d.upper_bound)
            flips = an.flips(arm)
            m["flip_rate"] = flips.rate if flips else None
            sp = an.speedup(arm)
            m["ttft_speedup"] = sp["ratio_of_medians"] if sp else None
        m["hit_rate"] = an.hit_rate(arm)
        t = an.ttft(arm)
        m["ttft_p50_s"] = t["p50"] if t else None
        out[arm] = {k: float(v) for k, v in m.items() if number(v) is not None}
    return out


def digest(*parts: Any) -> str:
    """SHA-256 of ``parts`` as sorted JSON (an id that is the same for the same run)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
