"""Reuse-dynamics coverage: does a dataset actually exercise segment reuse?

Definitions (an *occurrence* is one segment at one slot of one case):

- **references per segment**: occurrences of the segment over all cases.
- **slot**: the segment's index in ``case.segment_ids``; **token offset**: the summed token counts
  of the segments before it in that case, i.e. its offset from the start of the document region
  (delimiters and the head are left out: they shift every offset of a slot alike).
- **order**: the ordered tuple of a case's segment ids.
- **preceding context**: ``(system, prefix, ids of the segments before it)``.
- **never-cached position**: the neutral warm-up computes each segment's KV right after a fixed
  neutral head, at token offset 0 of the document region. An occurrence sits at a never-cached
  position when its token offset is not 0 (for non-empty segments: when its slot is not 0), so
  reuse must re-rotate its keys. ``never_cached_position_share`` is the share of occurrences so.
- **foreign context**: an occurrence whose user-turn content before it (prefix plus earlier
  segments) is not empty, unlike the warm-up's; ``foreign_context_share`` is their share. Both
  shares leave the system prompt out, since the warm-up's head never equals a case's; the number
  of distinct system prompts is reported beside them.

Per-segment figures (references, distinct slots, offsets, orders, contexts) are summarised as
mean, median, max and ``share_gt1`` (share of segments with more than one).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from kvaudit.core.dataset_format import Case, Segment

REUSE_WARNING = "every segment appears exactly once: this dataset cannot measure reuse"
POSITION_WARNING = ("no segment ever sits at a never-cached position: re-rotation error is "
                    "not exercised")


def refs_bucket(n: int) -> str:
    """Power-of-two bucket of a reference count: 1, 2, 3-4, 5-8, 9-16, ..."""
    if n <= 2:
        return str(n)
    hi = 1 << math.ceil(math.log2(n))
    return f"{hi // 2 + 1}-{hi}"


def _bucket_lo(label: str) -> int:
    return int(label.split("-")[0])


def _summary(values: Iterable[int]) -> dict[str, float]:
    v = list(values)
    if not v:
        return {"mean": 0.0, "median": 0.0, "max": 0, "share_gt1": 0.0}
    return {
        "mean": round(statistics.fmean(v), 4),
        "median": float(statistics.median(v)),
        "max": max(v),
        "share_gt1": round(sum(1 for x in v if x > 1) / len(v), 4),
    }


def _range(values: list[int]) -> dict[str, float]:
    if not values:
        return {"min": 0, "median": 0.0, "max": 0}
    return {"min": min(values), "median": float(statistics.median(values)), "max": max(values)}


class _Tally:
    """What coverage counts, case by case: per segment its references, slots, offsets, orders and
    contexts (head and what precedes it); the heads, document sets, tasks, strata and token sizes."""

    def __init__(self, segments: dict[str, Segment], count: Callable[[str], int]) -> None:
        self.segments, self.count = segments, count
        self.str_tokens: dict[str, int] = {}
        # per segment: [references, slots, offsets, orders, contexts, token count]
        self.per_seg: dict[str, list] = {}
        self.heads: dict[tuple[str, str], int] = {}
        self.doc_sets: dict[frozenset, set[tuple[str, ...]]] = defaultdict(set)
        self.tasks: Counter[str] = Counter()
        self.strata: dict[str, Counter[str]] = defaultdict(Counter)
        self.region_tokens: list[int] = []
        self.prompt_tokens: list[int] = []
        self.n_occ = self.never_cached = self.foreign = 0

    def ntok_str(self, s: str) -> int:
        n = self.str_tokens.get(s)
        if n is None:
            n = self.str_tokens[s] = self.count(s) if s else 0
            if len(self.str_tokens) > 50_000:  # questions and prefixes rarely repeat at scale
                self.str_tokens.clear()
        return n

    def add(self, case: Case) -> None:
        order = tuple(case.segment_ids)
        self.tasks[case.task] += 1
        for k, v in case.strata.items():
            self.strata[k][str(v)] += 1
        head = self.heads.setdefault((case.system, case.prefix), len(self.heads))
        self.doc_sets[frozenset(order)].add(order)
        off = 0
        for i, sid in enumerate(order):
            rec = self.per_seg.get(sid)
            if rec is None:
                rec = self.per_seg[sid] = [0, set(), set(), set(), set(), self.count(self.segments[sid].text)]
            rec[0] += 1
            rec[1].add(i)
            rec[2].add(off)
            rec[3].add(order)
            rec[4].add((head, order[:i]))
            if off:
                self.never_cached += 1
            if i or case.prefix:
                self.foreign += 1
            off += rec[5]
        self.n_occ += len(order)
        self.region_tokens.append(off)
        self.prompt_tokens.append(off + self.ntok_str(case.system) + self.ntok_str(case.prefix)
                                  + self.ntok_str(case.question))


def compute_coverage(segments: dict[str, Segment], cases: list[Case],
                     count_tokens: Callable[[str], int] | None = None) -> dict:
    """Reuse-dynamics coverage of ``cases`` over ``segments`` (definitions in the module doc).

    ``count_tokens`` measures offsets and prompt sizes; ``None`` counts whitespace words.
    Segments never referenced are counted in ``unused_segments`` and left out of the
    per-segment figures. The result is JSON-ready and deterministic.
    """
    t = _Tally(segments, count_tokens or (lambda text: len(text.split())))
    for case in cases:
        t.add(case)
    per_seg, n_occ = t.per_seg, t.n_occ
    refs = {s: r[0] for s, r in per_seg.items()}
    used = sorted(refs)
    hist = Counter(refs_bucket(refs[s]) for s in used)
    warnings = []
    if used and all(refs[s] == 1 for s in used):
        warnings.append(REUSE_WARNING)
    elif n_occ and t.never_cached == 0:
        warnings.append(POSITION_WARNING)
    return {
        "n_cases": len(cases),
        "n_segments": len(used),
        "unused_segments": sum(1 for s in segments if s not in refs),
        "n_occurrences": n_occ,
        "token_unit": "whitespace words" if count_tokens is None else "tokenizer tokens",
        "refs_per_segment": _summary(refs[s] for s in used),
        "refs_histogram": [{"refs": b, "segments": hist[b]} for b in sorted(hist, key=_bucket_lo)],
        "distinct_slots_per_segment": _summary(len(per_seg[s][1]) for s in used),
        "distinct_offsets_per_segment": _summary(len(per_seg[s][2]) for s in used),
        "distinct_orders_per_segment": _summary(len(per_seg[s][3]) for s in used),
        "distinct_contexts_per_segment": _summary(len(per_seg[s][4]) for s in used),
        "never_cached_position_share": round(t.never_cached / n_occ, 4) if n_occ else 0.0,
        "foreign_context_share": round(t.foreign / n_occ, 4) if n_occ else 0.0,
        "distinct_orders": sum(len(v) for v in t.doc_sets.values()),
        "distinct_doc_sets": len(t.doc_sets),
        "doc_sets_with_several_orders": sum(1 for v in t.doc_sets.values() if len(v) > 1),
        "distinct_system_prompts": len({sys_ for sys_, _ in t.heads}),
        "distinct_prefixes": len({p for _, p in t.heads}),
        "leak_probes": sum(1 for c in cases if c.canary),
        "doc_region_tokens": _range(t.region_tokens),
        "prompt_tokens_estimate": _range(t.prompt_tokens),
        "tasks": dict(sorted(t.tasks.items())),
        "strata": {k: dict(sorted(v.items())) for k, v in sorted(t.strata.items())},
        "warnings": warnings,
    }

def format_summary(cov: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    def pct(x: float) -> str:
        return f"{100 * x:.0f}%"

    r = cov["refs_per_segment"]
    lines = [
        f"coverage: {cov['n_cases']} cases, {cov['n_segments']} segments, "
        f"{cov['n_occurrences']} segment occurrences",
        f"  references per segment: mean {r['mean']:.1f}, median {r['median']:g}, max {r['max']}; "
        f"referenced more than once: {pct(r['share_gt1'])}",
        "  histogram: " + ", ".join(f"{h['refs']}: {h['segments']}" for h in cov["refs_histogram"]),
        f"  per segment (mean): {cov['distinct_slots_per_segment']['mean']:.1f} slots, "
        f"{cov['distinct_offsets_per_segment']['mean']:.1f} offsets, "
        f"{cov['distinct_orders_per_segment']['mean']:.1f} orders, "
        f"{cov['distinct_contexts_per_segment']['mean']:.1f} preceding contexts",
        f"  occurrences at a never-cached position: {pct(cov['never_cached_position_share'])}; "
        f"after foreign context: {pct(cov['foreign_context_share'])}; "
        f"{cov['doc_sets_with_several_orders']} of {cov['distinct_doc_sets']} document sets in several orders",
        f"  prompt size ({cov['token_unit']}, no template): "
        f"{cov['prompt_tokens_estimate']['min']}-{cov['prompt_tokens_estimate']['max']}, "
        f"median {cov['prompt_tokens_estimate']['median']:g}",
        "  tasks: " + ", ".join(f"{k} {v}" for k, v in cov["tasks"].items()),
    ]
    return "\n".join(lines)
