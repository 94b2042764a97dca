"""Answer scores (LongBench normalisation, EM, F1, ROUGE-L, containment) and per-pair signals."""

from __future__ import annotations

import math

import pytest

from kvaudit.core.run_format import ArmResult, PairRecord
from kvaudit.reports.scoring import (
    cluster_key,
    contains,
    exact_match,
    normalize_answer,
    rouge_l,
    score_pairs,
    token_f1,
)


def arm(name: str, answer: str, *, first: int = 5, margin: float = 3.0, diff: float | None = None) -> ArmResult:
    return ArmResult(arm=name, answer=answer, answer_ids=[first], top_k=[[first, 10.0], [first + 1, 10.0 - margin]],
                     margin=margin, ttft_s=1.0, tokens_reused=0, tokens_computed=10, ids_hash="h",
                     segment_hashes=[], truncation={}, decoding={}, logit_diff_vs_recompute=diff)


def pair(case_id: str, arms: dict[str, ArmResult], *, task: str = "single_doc", answers=("Paris",),
         metric: str = "em", evidence=("s1",), segment_ids=("s1", "s2"), strata=None) -> PairRecord:
    return PairRecord(case_id=case_id, task=task, strata=strata or {"hops": 1}, n_prompt_tokens=10, ids_hash="x",
                      segment_ids=list(segment_ids), segment_hashes=[], segment_spans=[], truncation={},
                      decoding={}, arm_order=list(arms), arms=arms, answers=list(answers), metric=metric,
                      evidence=list(evidence))


def test_normalisation_drops_case_punctuation_and_articles():
    assert normalize_answer("  The Cat, sat on   a MAT! ") == "cat sat on mat"
    assert normalize_answer("An apple.") == "apple"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_exact_match_takes_the_best_gold():
    assert exact_match("the Eiffel Tower.", ["Louvre", "Eiffel tower"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0


def test_token_f1_known_value():
    # pred tokens {big, red, dog} vs gold {red, dog}: P = 2/3, R = 1, F1 = 0.8
    assert token_f1("the big red dog", ["red dog"]) == pytest.approx(0.8)
    assert token_f1("cat", ["dog"]) == 0.0
    assert token_f1("", [""]) == 1.0


def test_rouge_l_known_value_and_unicode():
    # LCS 3 of a 3-token prediction and a 4-token reference: P = 1, R = 0.75
    assert rouge_l("alpha gamma delta", ["alpha beta gamma delta"]) == pytest.approx(2 * 0.75 / 1.75)
    # rouge-score's own tokenizer would drop non-ASCII words; ours keeps them
    assert rouge_l("Zoë Müller", ["zoë müller"]) == 1.0
    assert rouge_l("北京", ["上海"]) == 0.0


def test_containment_respects_word_boundaries():
    assert contains("It was Film 12, in 1999.", ["film 12"]) == 1.0
    assert contains("Film 123", ["Film 12"]) == 0.0
    assert contains("anything", [""]) == 0.0


def test_agreement_cases_score_against_recompute_answer():
    p = pair("a1", {"recompute": arm("recompute", "Blue whales sing"),
                    "reuse": arm("reuse", "blue whales sing."),
                    "reuse_norope": arm("reuse_norope", "Dolphins")},
             answers=(), metric="agreement", task="agreement")
    df = score_pairs([p]).set_index("arm")
    assert df.loc["reuse", "score"] == 1.0
    assert df.loc["recompute", "score"] == 1.0
    assert df.loc["reuse_norope", "score"] == 0.0
    assert bool(df.loc["reuse", "flip"])  # the text differs even though it scores the same
    assert df.loc["reuse", "scorable"]


def test_pair_signals_flip_logit_diff_top1_and_near_tie():
    p = pair("c1", {"recompute": arm("recompute", "Paris", margin=0.2),
                    "reuse": arm("reuse", "Lyon", first=9, diff=2.5),
                    "recompute_again": arm("recompute_again", "Paris", diff=1e-5)})
    df = score_pairs([p], near_tie=1.0).set_index("arm")
    assert df.loc["reuse", "flip"] is True and df.loc["recompute_again", "flip"] is False
    assert df.loc["reuse", "top1_changed"] is True and df.loc["recompute_again", "top1_changed"] is False
    assert df.loc["reuse", "logit_diff"] == 2.5
    assert df.loc["reuse", "em"] == 0.0 and df.loc["recompute", "em"] == 1.0
    assert df["near_tie"].all()  # recompute margin 0.2 < 1.0
    assert df.loc["recompute", "flip"] is None
    assert df.loc["reuse", "stratum:hops"] == "1"
    assert not score_pairs([p], near_tie=0.1)["near_tie"].any()


def test_leak_probes_and_gold_less_cases_are_not_scored():
    probe = pair("l1", {"recompute": arm("recompute", "Ada"), "reuse": arm("reuse", "Ada")}, task="leak_probe",
                 answers=("Ada",), metric="contains")
    nogold = pair("n1", {"recompute": arm("recompute", "x"), "reuse": arm("reuse", "y")}, answers=())
    df = score_pairs([probe, nogold])
    assert not df["scorable"].any()
    assert all(math.isnan(v) for v in df["score"])
    assert df.loc[df["case_id"] == "n1", "flip"].dropna().tolist() == [True]


def test_cluster_key_uses_sorted_evidence_else_segments():
    assert cluster_key(pair("a", {}, evidence=("s9", "s1"))) == "s1|s9"
    assert cluster_key(pair("b", {}, evidence=("s1", "s9"))) == "s1|s9"
    assert cluster_key(pair("c", {}, evidence=(), segment_ids=("s3", "s2"))) == "s2|s3"
