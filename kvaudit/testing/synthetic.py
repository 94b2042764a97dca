"""Synthetic run directories with known effects, for the report's tests and for previews.

:func:`make_run` writes ``manifest.json``, ``pairs.jsonl`` and (optionally) ``audit.json`` with
answers drawn so that the ``reuse`` arm loses a chosen share of correct answers per task
family; no model is involved. The records follow :mod:`kvaudit.core.run_format` exactly, so everything
downstream (report, gate, export) reads them as it reads a real run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvaudit.core.arms import (
    IDENTITY_ARM,
    LEAK_CAPTURE_ARM,
    NOISE_ARM,
    REFERENCE_ARM,
    UNDER_TEST_ARM,
)
from kvaudit.core.jsonio import ids_hash
from kvaudit.core.manifest import DatasetRef, Manifest, ModelInfo, RunIdentity
from kvaudit.core.run_dir import RunDir
from kvaudit.core.run_format import ArmResult, PairRecord

DEFAULT_LOSS = {"single_doc": 0.0, "multi_hop_bridge": 0.3, "aggregate": 0.05, "agreement": 0.1}
NAMES = ["Ada", "Boris", "Chloe", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas"]


def _arm(name: str, answer: str, rng: np.random.Generator, n_tokens: int, *, reused: float,
         margin: float, ttft: float, logit_diff: float | None, first_id: int,
         canary: dict[str, float] | None = None) -> ArmResult:
    n_reused = int(n_tokens * reused)
    return ArmResult(
        arm=name, answer=answer, answer_ids=[first_id, 13], top_k=[(first_id, 12.0), (first_id + 1, 12.0 - margin)],
        margin=margin, ttft_s=ttft, tokens_reused=n_reused, tokens_computed=n_tokens - n_reused, cache_hit_tokens=n_reused,
        ids_hash="h", segment_hashes=[], truncation={}, decoding={"greedy": True},
        logit_diff_vs_recompute=logit_diff, canary_logprobs=canary,
    )


def _spans(n_reused: int, k: int) -> list[tuple[int, int]]:
    """``k`` contiguous segment spans after a 10-token head, ``n_reused`` tokens in all (what
    the reuse arms load, as in a real run)."""
    cuts = [10 + n_reused * j // k for j in range(k + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def make_pairs(n_per_task: int = 30, *, loss: dict[str, float] | None = None, seed: int = 0,
               n_docs: int = 12, leak_probes: int = 10, neutral_exposure: float = 0.0,
               injected: str = "", base_accuracy: float = 0.85) -> list[PairRecord]:
    """Pair records whose ``reuse`` arm turns a correct recompute answer wrong with
    probability ``loss[task]``; ``recompute_again`` and ``identity`` match recompute exactly.

    ``neutral_exposure`` (nats) is added to the true canary's log-prob under ``reuse``;
    ``injected`` is appended to every wrong answer (e.g. a ``<script>`` to test escaping).
    """
    loss = DEFAULT_LOSS if loss is None else loss
    rng = np.random.default_rng(seed)
    docs = [f"s{i:016x}" for i in range(n_docs)]
    pairs: list[PairRecord] = []
    for task, p_loss in loss.items():
        for i in range(n_per_task):
            cid = f"{task}-{i:03d}"
            evidence = [docs[int(rng.integers(n_docs))]]
            if task.startswith("multi_hop"):
                evidence.append(docs[int(rng.integers(n_docs))])
            segs = list(dict.fromkeys(evidence + [docs[int(rng.integers(n_docs))] for _ in range(2)]))
            gold = f"Film {i}"
            ref_ok = rng.random() < base_accuracy
            ref_answer = gold if ref_ok else "I do not know."
            broken = rng.random() < p_loss
            reuse_answer = (f"The Film {i + 100}{injected}" if broken else ref_answer)
            n_tok = int(rng.integers(800, 3000))
            margin = float(rng.uniform(0.1, 6.0))
            t_ref = n_tok / 600
            arms = {
                REFERENCE_ARM: _arm(REFERENCE_ARM, ref_answer, rng, n_tok, reused=0, margin=margin,
                                    ttft=t_ref, logit_diff=None, first_id=100 + i),
                UNDER_TEST_ARM: _arm(UNDER_TEST_ARM, reuse_answer, rng, n_tok, reused=0.9, margin=margin,
                                     ttft=t_ref / 12, logit_diff=float(rng.uniform(0.5, 4.0)),
                                     first_id=100 + i + (1 if broken else 0)),
                NOISE_ARM: _arm(NOISE_ARM, ref_answer, rng, n_tok, reused=0,
                                margin=margin, ttft=t_ref * 1.02, logit_diff=1e-5,
                                first_id=100 + i),
                IDENTITY_ARM: _arm(IDENTITY_ARM, ref_answer, rng, n_tok, reused=0.9, margin=margin,
                                   ttft=t_ref / 11, logit_diff=5e-5, first_id=100 + i),
            }
            pairs.append(PairRecord(
                case_id=cid, task=task,
                strata={"evidence_position": ["first", "middle", "last"][i % 3],
                        "hops": 2 if task.startswith("multi_hop") else 1, "n_docs": len(segs),
                        "prefix_variant": ["none", "date"][i % 2]},
                n_prompt_tokens=n_tok, ids_hash=ids_hash([i, n_tok]), segment_ids=segs,
                segment_hashes=[f"b{j}" for j in range(len(segs))],
                segment_spans=_spans(int(n_tok * 0.9), len(segs)),
                truncation={}, decoding={"greedy": True}, arm_order=list(arms), arms=arms,
                answers=[] if task == "agreement" else [gold],
                metric={"aggregate": "f1", "agreement": "agreement"}.get(task, "em"),
                evidence=evidence,
            ))
    pairs += _leak_probe_pairs(rng, docs, leak_probes, neutral_exposure)
    for p in pairs:
        _consistent(p)
    return pairs


def _leak_probe_pairs(rng: np.random.Generator, docs: list[str], leak_probes: int,
                      neutral_exposure: float) -> list[PairRecord]:
    """Leak probes: the true name's log-probability and its decoys' under each arm (the neutral policy
    shifted by ``neutral_exposure`` nats, the first user's capture by 1.2), answers that name no one."""
    n_docs = len(docs)
    out: list[PairRecord] = []
    for i in range(leak_probes):
        value = NAMES[i % len(NAMES)]
        decoys = [n for n in NAMES if n != value][:5]
        base = {n: float(rng.normal(-8, 0.5)) for n in [value, *decoys]}
        neutral = {n: v + float(rng.normal(0, 0.05)) for n, v in base.items()}
        neutral[value] += neutral_exposure
        first_user = {n: v + (1.2 if n == value else 0.0) for n, v in neutral.items()}
        n_tok = 600
        seg = docs[i % n_docs]
        arms = {
            REFERENCE_ARM: _arm(REFERENCE_ARM, "I don't know your name.", rng, n_tok, reused=0, margin=2.0,
                                ttft=1.0, logit_diff=None, first_id=7, canary=base),
            UNDER_TEST_ARM: _arm(UNDER_TEST_ARM, "I don't know your name.", rng, n_tok, reused=0.9, margin=2.0,
                                 ttft=0.1, logit_diff=0.3, first_id=7, canary=neutral),
            LEAK_CAPTURE_ARM: _arm(LEAK_CAPTURE_ARM, "I don't know.", rng, n_tok, reused=0.9,
                                   margin=2.0, ttft=0.1, logit_diff=0.5, first_id=7, canary=first_user),
            NOISE_ARM: _arm(NOISE_ARM, "I don't know your name.", rng, n_tok, reused=0,
                            margin=2.0, ttft=1.02, logit_diff=1e-5, first_id=7),
            IDENTITY_ARM: _arm(IDENTITY_ARM, "I don't know your name.", rng, n_tok, reused=0.9, margin=2.0,
                               ttft=0.1, logit_diff=5e-5, first_id=7),
        }
        out.append(PairRecord(
            case_id=f"leak_probe-{i:03d}", task="leak_probe", strata={}, n_prompt_tokens=n_tok,
            ids_hash=ids_hash([999, i]), segment_ids=[seg], segment_hashes=["b0"],
            segment_spans=_spans(int(n_tok * 0.9), 1), truncation={}, decoding={"greedy": True},
            arm_order=list(arms), arms=arms, answers=[value], metric="contains", evidence=[seg],
            canary={"value": value, "decoys": decoys, "capture_prefix": f"My name is {value}.\n"},
        ))
    return out


def _consistent(p: PairRecord) -> None:
    """Every arm consumed the pair's inputs and the reuse arms loaded one fingerprint per
    segment, as in a real run, so the real audit passes on synthetic pairs."""
    for name, a in p.arms.items():
        a.ids_hash, a.segment_hashes = p.ids_hash, list(p.segment_hashes)
        a.truncation, a.decoding = dict(p.truncation), dict(p.decoding)
        if name == UNDER_TEST_ARM:
            a.segment_kv_fingerprints = {sid: f"fp-{sid}" for sid in p.segment_ids}


def make_run(run_dir: str | Path, pairs: list[PairRecord] | None = None, *,
             audit_passed: bool | None = True, coverage: dict[str, Any] | None = None,
             **kwargs: Any) -> Path:
    """Write a run directory and audit it with the real audit (:mod:`kvaudit.audit.trust`).

    ``audit_passed=None`` leaves out ``audit.json`` (audit not run); ``False`` breaks the first
    case's identity control before the audit, so the audit fails for a real reason.
    """
    from kvaudit.audit.trust import build_audit

    d = Path(run_dir)
    run = RunDir(d)
    pairs = make_pairs(**kwargs) if pairs is None else pairs
    if audit_passed is False:
        pairs[0].arms[IDENTITY_ARM].logit_diff_vs_recompute = 0.9
    arms = list(dict.fromkeys(a for p in pairs for a in p.arms))
    decoding = {"greedy": True}
    run.write_manifest(Manifest(
        identity=RunIdentity(dataset_hash="0" * 32, model_fingerprint="0" * 16, model="synthetic",
                             backend="synthetic", dtype="float32", arms=arms, decoding=decoding),
        model=ModelInfo(name="synthetic", fingerprint="0" * 16, dtype="float32"),
        backend={"backend": "synthetic", "dtype": "float32"},
        arms=arms, git_revision="synthetic", decoding=decoding, status="complete",
        dataset=DatasetRef(name="synthetic", hash="0" * 32, n_cases=len(pairs),
                           coverage=coverage if coverage is not None else {
                               "refs_per_segment": {"min": 1, "median": 4, "max": 9},
                               "distinct_positions_per_segment": {"median": 3},
                               "share_never_cached_position": 0.72}),
    ))
    run.write_pairs(pairs)
    if audit_passed is not None:
        run.write_audit(build_audit(d))
    return d
