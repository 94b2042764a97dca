"""Synthetic repair arms and the oracle pair, added to :func:`kvaudit.testing.synthetic.make_pairs`'s
records, for the report's, the gate's and the audit's tests (no model).

:func:`add_repair_arms` gives every pair each named repair arm (``blend@R``, ``epic@K``) built
from the pair's own ``reuse`` and ``recompute`` records: a repair recovers each answer reuse
broke with probability ``recover`` and costs ``ttft`` times the reference's TTFT. Its token
counts follow :func:`kvaudit.core.arms.repair_count` on the pair's spans, so the real audit's
``reuse_happened`` holds; an arm that recomputes nothing is reuse's record exactly and one that
recomputes everything is the reference's answer at an identity-sized logit difference, so the
repair controls pass. :func:`add_oracle_pair` adds ``oracle_recompute`` and ``oracle`` on the
evidence-only prompt, with ``oracle`` losing a chosen share of reuse's losses.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from kvaudit.core.arms import (
    ORACLE_ARM,
    ORACLE_REFERENCE_ARM,
    REFERENCE_ARM,
    UNDER_TEST_ARM,
    evidence_only,
    get_arm,
    repair_count,
)
from kvaudit.core.jsonio import ids_hash
from kvaudit.core.run_format import PairRecord, flipped

# name -> (share of reuse's broken answers recovered, TTFT as a share of the reference's)
DEFAULT_REPAIRS: dict[str, tuple[float, float]] = {
    "blend@0": (0.0, 0.1), "blend@0.15": (0.9, 0.3), "blend@1": (1.0, 1.2), "epic@0": (0.0, 0.09),
    "epic@16": (0.4, 0.2),
}


def add_repair_arms(pairs: list[PairRecord], repairs: dict[str, tuple[float, float]] | None = None,
                    *, seed: int = 1) -> list[PairRecord]:
    """Add each repair arm to every pair (in place; returned for chaining)."""
    rng = np.random.default_rng(seed)
    for p in pairs:
        reuse, ref = p.arms[UNDER_TEST_ARM], p.arms[REFERENCE_ARM]
        n_seg = sum(e - s for s, e in p.segment_spans)
        for name, (recover, ttft) in (DEFAULT_REPAIRS if repairs is None else repairs).items():
            spec = get_arm(name)
            k = repair_count(spec, p.segment_spans)
            if k == 0:
                arm = replace(reuse, arm=name, ttft_s=ref.ttft_s * ttft)
            elif k == n_seg:
                arm = replace(ref, arm=name, tokens_reused=0, tokens_computed=p.n_prompt_tokens,
                              ttft_s=ref.ttft_s * ttft, logit_diff_vs_recompute=5e-5,
                              segment_kv_fingerprints=dict(reuse.segment_kv_fingerprints))
            else:
                fixed = flipped(reuse, ref) and rng.random() < recover
                src = ref if fixed or not flipped(reuse, ref) else reuse
                arm = replace(src, arm=name, tokens_reused=n_seg - k, tokens_computed=p.n_prompt_tokens - n_seg + k,
                              ttft_s=ref.ttft_s * ttft,
                              logit_diff_vs_recompute=(reuse.logit_diff_vs_recompute or 0.0) * (1 - recover),
                              segment_kv_fingerprints=dict(reuse.segment_kv_fingerprints),
                              cache_hit_tokens=n_seg - k)
            p.arms[name] = arm
            p.arm_order.append(name)
    return pairs


def add_oracle_pair(pairs: list[PairRecord], *, keep_loss: float = 0.5, seed: int = 2) -> list[PairRecord]:
    """Add the oracle pair where it runs (kept evidence, no canary); ``oracle`` keeps each of
    reuse's losses with probability ``keep_loss`` (the rest came with the distractors)."""
    rng = np.random.default_rng(seed)
    for p in pairs:
        keep = evidence_only(p.segment_ids, p.evidence, bool(p.canary))
        if not keep:
            continue
        reuse, ref = p.arms[UNDER_TEST_ARM], p.arms[REFERENCE_ARM]
        spans = [(s, e) for sid, (s, e) in zip(p.segment_ids, p.segment_spans) if sid in set(keep)]
        n = p.n_prompt_tokens - sum(e - s for s, e in p.segment_spans) + sum(e - s for s, e in spans)
        reused = sum(e - s for s, e in spans)
        hashes = [h for sid, h in zip(p.segment_ids, p.segment_hashes) if sid in set(keep)]
        common: dict[str, Any] = {"ids_hash": ids_hash([len(keep), n, hash(p.case_id) % 997]),
                                  "segment_hashes": hashes, "truncation": {"truncated": False}}
        p.arms[ORACLE_REFERENCE_ARM] = replace(ref, arm=ORACLE_REFERENCE_ARM, tokens_reused=0, tokens_computed=n,
                                               ttft_s=ref.ttft_s * n / p.n_prompt_tokens,
                                               logit_diff_vs_recompute=0.2, **common)
        lost = flipped(reuse, ref) and rng.random() < keep_loss
        src = reuse if lost else ref
        p.arms[ORACLE_ARM] = replace(src, arm=ORACLE_ARM, tokens_reused=reused, tokens_computed=n - reused,
                                     ttft_s=reuse.ttft_s, cache_hit_tokens=reused,
                                     logit_diff_vs_recompute=1.0 if lost else 0.05,
                                     segment_kv_fingerprints={s: f"fp-{s}" for s in keep}, **common)
        p.arm_order += [ORACLE_REFERENCE_ARM, ORACLE_ARM]
    return pairs
