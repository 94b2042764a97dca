"""Reuse-dynamics coverage on small examples whose numbers were worked out by hand."""

from __future__ import annotations

import pytest

from kvaudit.core.coverage import (
    POSITION_WARNING,
    REUSE_WARNING,
    compute_coverage,
    format_summary,
    refs_bucket,
)
from kvaudit.core.dataset_format import Case, Segment

S = "Answer using only the documents."


def _segs(**texts: str) -> dict[str, Segment]:
    return {k: Segment(k, v) for k, v in texts.items()}


def _case(i: int, ids: list[str], prefix: str = "", system: str = S, **strata) -> Case:
    return Case(id=f"c{i}", task="single_doc", segment_ids=ids, question="q?", answers=["x"],
                system=system, prefix=prefix, strata=dict(strata))


@pytest.fixture
def example() -> tuple[dict[str, Segment], list[Case]]:
    segs = _segs(A="a a", B="b b b", C="c", D="never used")
    cases = [
        _case(1, ["A", "B"], n_docs=2),
        _case(2, ["B", "A"], prefix="p\n", n_docs=2),
        _case(3, ["A", "C"], n_docs=2),
        _case(4, ["C"], n_docs=1),
    ]
    return segs, cases


def test_hand_checked_example(example):
    segs, cases = example
    cov = compute_coverage(segs, cases)
    # references: A 3, B 2, C 2; D unused
    assert cov["n_segments"] == 3 and cov["unused_segments"] == 1 and cov["n_occurrences"] == 7
    assert cov["refs_per_segment"] == {"mean": round(7 / 3, 4), "median": 2.0, "max": 3,
                                       "share_gt1": 1.0}
    assert cov["refs_histogram"] == [{"refs": "2", "segments": 2}, {"refs": "3-4", "segments": 1}]
    # slots: A {0,1}, B {0,1}, C {0,1}; offsets (words): A {0,3}, B {2,0}, C {2,0}
    assert cov["distinct_slots_per_segment"]["mean"] == 2.0
    assert cov["distinct_offsets_per_segment"]["mean"] == 2.0
    # orders: A in (A,B),(B,A),(A,C); B in (A,B),(B,A); C in (A,C),(C,)
    assert cov["distinct_orders_per_segment"] == {"mean": round(7 / 3, 4), "median": 2.0,
                                                  "max": 3, "share_gt1": 1.0}
    # contexts: A after (S,"",()) twice and (S,"p",(B,)) once -> 2; B 2; C 2
    assert cov["distinct_contexts_per_segment"]["mean"] == 2.0
    # never-cached: B in c1, A in c2, C in c3 -> 3 of 7; foreign adds B in c2 (after a prefix)
    assert cov["never_cached_position_share"] == round(3 / 7, 4)
    assert cov["foreign_context_share"] == round(4 / 7, 4)
    assert cov["distinct_doc_sets"] == 3 and cov["doc_sets_with_several_orders"] == 1
    assert cov["distinct_orders"] == 4
    assert cov["tasks"] == {"single_doc": 4}
    assert cov["strata"] == {"n_docs": {"1": 1, "2": 3}}
    assert cov["doc_region_tokens"] == {"min": 1, "median": 4.0, "max": 5}
    assert cov["warnings"] == []


def test_custom_token_counter_moves_offsets(example):
    segs, cases = example
    cov = compute_coverage(segs, cases, count_tokens=len)  # characters as "tokens"
    # doc regions: c1 3+5, c2 5+3, c3 3+1, c4 1
    assert cov["doc_region_tokens"] == {"min": 1, "median": 6.0, "max": 8}
    assert cov["token_unit"] == "tokenizer tokens"
    assert cov["never_cached_position_share"] == round(3 / 7, 4)


def test_distinct_offsets_differ_from_slots():
    # B sits at slot 1 twice but after segments of different lengths: 1 slot, 2 offsets
    segs = _segs(A="a", L="l l l l", B="b")
    cov = compute_coverage(segs, [_case(1, ["A", "B"]), _case(2, ["L", "B"])])
    assert cov["distinct_slots_per_segment"]["max"] == 1
    assert cov["distinct_offsets_per_segment"]["max"] == 2


def test_every_segment_once_warns():
    segs = _segs(A="a", B="b")
    cov = compute_coverage(segs, [_case(1, ["A"]), _case(2, ["B"])])
    assert cov["warnings"] == [REUSE_WARNING]
    assert cov["refs_per_segment"]["share_gt1"] == 0.0


def test_reuse_only_at_cached_position_warns():
    segs = _segs(A="a")
    cov = compute_coverage(segs, [_case(1, ["A"]), _case(2, ["A"], prefix="x\n")])
    assert cov["warnings"] == [POSITION_WARNING]
    assert cov["never_cached_position_share"] == 0.0
    assert cov["foreign_context_share"] == 0.5
    assert cov["distinct_contexts_per_segment"]["max"] == 2


@pytest.mark.parametrize("n,label", [(1, "1"), (2, "2"), (3, "3-4"), (4, "3-4"), (5, "5-8"),
                                     (8, "5-8"), (9, "9-16"), (16, "9-16"), (17, "17-32")])
def test_refs_bucket(n, label):
    assert refs_bucket(n) == label


def test_summary_mentions_key_numbers(example):
    text = format_summary(compute_coverage(*example))
    assert "4 cases, 3 segments, 7 segment occurrences" in text
    assert "never-cached position: 43%" in text
    assert "single_doc 4" in text
