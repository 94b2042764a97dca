"""Per-case answer scores and per-pair divergence signals, as one tidy table.

Answers are normalised the way LongBench does (lowercase, drop punctuation, drop the articles
a/an/the, collapse whitespace) before exact match, token F1, ROUGE-L (the ``rouge-score``
package, fed our normalised tokens so non-Latin text is not dropped) and containment.

A case's *primary* score is the metric its dataset names (``PairRecord.metric``). Cases with
``metric == "agreement"`` have no gold answer: every arm is scored against the ``recompute``
arm's answer, and the primary score is token F1 against it (exact disagreement is already
counted as a flip).

Per arm other than ``recompute`` each row also carries:

``flip``          :func:`kvaudit.core.run_format.flipped` against recompute;
``logit_diff``    ``ArmResult.logit_diff_vs_recompute`` (max abs first-token logit difference);
``top1_changed``  the first token's top-1 id differs from recompute's (from ``top_k``);
``near_tie``      recompute's top-1/top-2 first-token margin is below the near-tie threshold,
                  so a flip there may be tie-breaking rather than damage.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import pandas as pd

from kvaudit.core.arms import REFERENCE_ARM, reference_of
from kvaudit.core.run_format import ArmResult, PairRecord, cluster_key, documents, flipped

SCORE_METRICS = ("em", "f1", "rouge_l", "contains")
# Answer-quality rows skip these tasks: leak probes are judged by kvaudit.stats.leaks.
NON_QUALITY_TASKS = frozenset({"leak_probe"})
DEFAULT_NEAR_TIE = 1.0  # logits; recompute margins below this count as near ties

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """LongBench normalisation: lowercase, strip punctuation and articles, collapse spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split()


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def _f1(pred: list[str], gold: list[str]) -> float:
    if not pred and not gold:
        return 1.0
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, golds: Sequence[str]) -> float:
    """Best LongBench ``qa_f1_score`` over the gold answers (two empty answers score 1)."""
    pred = _tokens(prediction)
    return max((_f1(pred, _tokens(g)) for g in golds), default=0.0)


class _NormalisedTokenizer:
    """rouge-score tokenizer that applies the LongBench normalisation (keeps non-ASCII words)."""

    def tokenize(self, text: str) -> list[str]:
        return _tokens(text)


@lru_cache(maxsize=1)
def _rouge_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_NormalisedTokenizer())


def rouge_l(prediction: str, golds: Sequence[str]) -> float:
    """Best ROUGE-L F-measure over the gold answers (two empty answers score 1)."""
    best = 0.0
    for g in golds:
        if not _tokens(prediction) and not _tokens(g):
            return 1.0
        best = max(best, _rouge_scorer().score(g, prediction)["rougeL"].fmeasure)
    return best


def contains(prediction: str, golds: Sequence[str]) -> float:
    """1 if some non-empty normalised gold answer occurs in the answer at word boundaries."""
    p = f" {normalize_answer(prediction)} "
    return float(any(n and f" {n} " in p for n in (normalize_answer(g) for g in golds)))


def score_answer(prediction: str, golds: Sequence[str]) -> dict[str, float]:
    """Every metric of :data:`SCORE_METRICS` for one answer against its references."""
    return {
        "em": exact_match(prediction, golds),
        "f1": token_f1(prediction, golds),
        "rouge_l": rouge_l(prediction, golds),
        "contains": contains(prediction, golds),
    }


def primary_metric(metric: str) -> str:
    """The score column a case's dataset metric maps to."""
    return "f1" if metric == "agreement" else metric


def references(pair: PairRecord) -> list[str] | None:
    """What a case's answers are scored against, or None when it cannot be scored."""
    if pair.metric == "agreement":
        ref = pair.arms.get(REFERENCE_ARM)
        return [ref.answer] if ref is not None else None
    return list(pair.answers) or None


def first_token(arm: ArmResult) -> int | None:
    """Top-1 first-token id from ``top_k`` (a list of (id, logit) pairs; JSON makes them lists)."""
    if not arm.top_k:
        return None
    return int(arm.top_k[0][0])


def score_pairs(pairs: Iterable[PairRecord], near_tie: float = DEFAULT_NEAR_TIE) -> pd.DataFrame:
    """One row per (case, arm) with scores, the primary score and divergence signals.

    Columns: case_id, task, arm, cluster, documents (tuple), metric, scorable, em, f1, rouge_l, contains, score,
    flip, logit_diff, top1_changed, near_tie, ttft_s, tokens_reused, tokens_computed, and one
    ``stratum:<key>`` column per key found in ``PairRecord.strata`` (values as strings).
    Rows whose case cannot be scored (no gold and not an agreement case, or a leak probe) keep
    NaN scores and ``scorable`` False; timing and flips are still filled in.
    """
    rows: list[dict[str, Any]] = []
    for pair in pairs:
        refs = references(pair)
        scorable = refs is not None and pair.task not in NON_QUALITY_TASKS
        reference = pair.arms.get(REFERENCE_ARM)
        ref_margin = reference.margin if reference is not None else None
        strata = {f"stratum:{k}": _stratum_value(v) for k, v in (pair.strata or {}).items()}
        for name, arm in pair.arms.items():
            scores = score_answer(arm.answer, refs) if scorable and refs is not None else dict.fromkeys(SCORE_METRICS, float("nan"))
            is_ref = name == REFERENCE_ARM
            # flips against the arm's own reference (the oracle's: its recompute on the same prompt)
            own = reference_of(name)
            ref_arm = pair.arms.get(own) if own != REFERENCE_ARM else reference
            rows.append({
                "case_id": pair.case_id,
                "task": pair.task,
                "arm": name,
                "cluster": cluster_key(pair),
                "documents": documents(pair),
                "metric": pair.metric,
                "scorable": scorable,
                **scores,
                "score": scores[primary_metric(pair.metric)],
                "flip": None if is_ref or ref_arm is None else flipped(arm, ref_arm),
                "logit_diff": None if is_ref else arm.logit_diff_vs_recompute,
                "top1_changed": (None if is_ref or ref_arm is None or first_token(arm) is None
                                 or first_token(ref_arm) is None
                                 else first_token(arm) != first_token(ref_arm)),
                "near_tie": None if ref_margin is None else bool(ref_margin < near_tie),
                "ttft_s": arm.ttft_s,
                "tokens_reused": arm.tokens_reused,
                "tokens_computed": arm.tokens_computed,
                **strata,
            })
    return pd.DataFrame(rows)


def _stratum_value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (list, tuple)):
        return ",".join(_stratum_value(x) for x in v)
    return str(v)
