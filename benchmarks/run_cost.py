"""Whole-run cost: the reuse arm plus its amortized one-time caching vs the recompute arm.

Builds a dataset where every prompt has about 2K+ tokens and every document is referenced by at
least 8 cases (in different orders and after different prefixes), runs it through the real
runner with arms recompute and reuse, and prints the wall-time split the manifest records.
Target: (reuse + caching) / recompute <= 0.5. Run by hand on a quiet machine:
    .venv/bin/python benchmarks/run_cost.py [--docs 6] [--per-case 3] [--refs 8] [--doc-tokens 750]
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from ttft import make_doc

from kvaudit.core.arms import parse_arms
from kvaudit.core.dataset_format import (
    Case,
    DatasetCard,
    Segment,
    read_dataset,
    segment_id,
    write_dataset,
)
from kvaudit.runners.engines.transformers.backend import open_backend
from kvaudit.runners.runner import RunConfig, execute


def build_dataset(be, out: Path, docs: int, per_case: int, refs: int, doc_tokens: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    texts = []
    for k in range(docs):
        text = make_doc(rng, int(doc_tokens * 0.7), k)
        while len(be.tok.unit_ids(text)) < doc_tokens:
            text += " " + make_doc(rng, 20, k).split(". ", 1)[1]
        texts.append(text)
    segs = [Segment(segment_id(t), t, source=f"doc{k}") for k, t in enumerate(texts)]
    n_cases = docs * refs // per_case
    cases = []
    for i in range(n_cases):
        # Round-robin windows so each document is referenced `refs` times, shuffled order per case.
        chosen = [segs[(i * per_case + j) % docs].id for j in range(per_case)]
        rng.shuffle(chosen)
        cases.append(Case(id=f"cost-{i:03d}", task="single_doc", segment_ids=chosen,
                          question="Which document number is mentioned first?", answers=["0"],
                          prefix=f"Session {rng.randint(1000, 9999)}, request {i}.\n"))
    write_dataset(out, segs, cases, DatasetCard(generator="benchmarks/run_cost.py", seed=seed))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=6)
    ap.add_argument("--per-case", type=int, default=3)
    ap.add_argument("--refs", type=int, default=8)
    ap.add_argument("--doc-tokens", type=int, default=750)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()

    be = open_backend("smollm2", max_new_tokens=args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        ds = build_dataset(be, Path(tmp) / "ds", args.docs, args.per_case, args.refs, args.doc_tokens)
        dataset = read_dataset(ds)
        cfg = RunConfig(dataset=dataset, out=Path(tmp) / "run", arms=parse_arms("recompute,reuse"),
                        model_name="smollm2")
        m = execute(cfg, be, progress=True)
    t = m.timing_s or {}
    s = m.sessions[-1]
    n = len(dataset.cases)
    lens = [sum(len(be.tok.unit_ids(dataset.segments[x].text)) for x in c.segment_ids) for c in dataset.cases]
    print(f"{n} cases, ~{min(lens)}-{max(lens)} document tokens per prompt, {args.docs} documents x {args.refs} references")
    print(f"warm-up forwards: {(s.segment_cache or {})['builds']} for {s.unique_segments_seen} unique segments")
    print(f"recompute arm {t['recompute']:.1f}s | reuse arm {t['reuse']:.1f}s | one-time caching {t['caching']:.1f}s")
    ratio = (t["reuse"] + t["caching"]) / t["recompute"]
    print(f"(reuse + caching) / recompute = {ratio:.2f}  (target <= 0.5; both arms include decoding "
          f"of up to {args.max_new_tokens} tokens)")


if __name__ == "__main__":
    main()
