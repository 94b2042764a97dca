"""Per-case records in the lm-evaluation-harness samples style (``RUN/samples.jsonl``).

One line per case::

    {"doc_id", "task", "prompt_hash", "doc_hash", "target", "target_hash",
     "resps": {arm: answer}, "filtered_resps": {arm: normalised answer},
     "metrics": {arm: {"em", "f1", "rouge_l", "contains", "score"}},
     "flips": {arm: bool}, "logit_diff": {arm: float}, "strata": {...}, "metric": str}

``prompt_hash`` is ``PairRecord.ids_hash`` (the canonical token ids every arm consumed);
``doc_hash`` is the SHA-256 of the case's segment ids joined by commas, in prompt order;
``target`` is the gold answers, or the recompute answer for agreement cases.
"""

from __future__ import annotations

import math
from typing import Any

from kvaudit.core.arms import REFERENCE_ARM
from kvaudit.core.jsonio import sha256_hex
from kvaudit.reports.analysis import Analysis
from kvaudit.reports.scoring import SCORE_METRICS, normalize_answer, references


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

