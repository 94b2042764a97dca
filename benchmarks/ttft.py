"""Time to first token: recompute vs segment reuse vs the fresh-token lower bound, side by side.

For prompts of about 1K, 2K, 4K and 8K tokens (two to four documents, a short prefix and a
question) it measures, on the same backend and ids:

- recompute: one prefill of every token, then the first token's argmax;
- reuse: cached segment KV (already built by the neutral warm-up) re-rotated and assembled,
  the head and tail prefilled fresh, then the argmax (exactly the runner's TTFT path);
- lower bound: the same two fresh forwards (head from scratch, tail on a ready cache of the
  same length) with no rotation or assembly.

Medians of several runs are printed with the ratios. Run by hand on a quiet machine:
    .venv/bin/python benchmarks/ttft.py [--sizes 1024,2048,4096,8192] [--repeats 3] [--dtype float32]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from kvaudit.core.arms import get_arm
from kvaudit.core.dataset_format import Case, Segment, segment_id
from kvaudit.runners.engines.transformers.backend import open_backend
from kvaudit.runners.prompt import assemble

WORDS = ("film studio director budget premiere audience critic sequel camera script actor festival "
         "release gross ticket season drama comedy thriller archive reel score editor producer").split()


def make_doc(rng: random.Random, n_words: int, k: int) -> str:
    sents = []
    while sum(len(s.split()) for s in sents) < n_words:
        sents.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + ".")
    return f"Document {k}. " + " ".join(sents)


def build_case(backend, target_tokens: int, seed: int) -> tuple[Case, dict[str, Segment]]:
    rng = random.Random(seed)
    n_docs = 2 if target_tokens <= 1024 else 3 if target_tokens <= 2048 else 4
    per_doc = target_tokens // n_docs
    texts = []
    for k in range(n_docs):
        words = int(per_doc * 0.7)
        text = make_doc(rng, words, k)
        # Adjust length in words until the doc is close to its token budget.
        while len(backend.tok.unit_ids(text)) < per_doc - 40:
            text += " " + make_doc(rng, 20, k).split(". ", 1)[1]
        texts.append(text)
    segs = {segment_id(t): Segment(segment_id(t), t) for t in texts}
    case = Case(id=f"bench-{target_tokens}", task="single_doc", segment_ids=list(segs),
                question="Which document mentions a festival first?", answers=["x"],
                prefix="Session 5521, 2026-11-30 08:00 UTC.\n")
    return case, segs


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(be, size: int, repeats: int) -> tuple[int, int, float, float, float, float]:
    """Median TTFT of recompute, reuse and the lower bound for one prompt size."""
    case, segs = build_case(be, size, seed=size)
    prompt = assemble(case, segs, be.tok, be.max_prompt_tokens)
    reuse = get_arm("reuse")
    _, build_s, _ = be.segment_entries(prompt, reuse, None)  # one-time warm-up, not timed below

    def recompute():
        _, logits, _ = be.prefill(prompt, get_arm("recompute"), [])
        int(torch.argmax(logits))

    def reused():
        es, _, _ = be.segment_entries(prompt, reuse, None)
        _, logits, _ = be.prefill(prompt, reuse, es)
        int(torch.argmax(logits))

    # Pre-assembled KV of the same length for the lower bound.
    cache = be.new_cache()
    be.forward(prompt.ids[: prompt.tail_start], 0, cache)
    ready_k, ready_v = be.stacked_kv(cache)
    ready_k, ready_v = ready_k.unsqueeze(1), ready_v.unsqueeze(1)

    def lower_bound():
        head = be.new_cache()
        be.forward(prompt.ids[: prompt.head_len], 0, head)
        c = be.new_cache([(ready_k[i], ready_v[i]) for i in range(ready_k.shape[0])])
        logits = be.forward(prompt.ids[prompt.tail_start:], prompt.tail_start, c)
        int(torch.argmax(logits[-1]))

    for fn in (recompute, reused, lower_bound):  # warm-up
        fn()
    t_re = statistics.median(timed(recompute) for _ in range(repeats))
    t_ru = statistics.median(timed(reused) for _ in range(repeats))
    t_lb = statistics.median(timed(lower_bound) for _ in range(repeats))
    return len(prompt.ids), len(segs), t_re, t_ru, t_lb, build_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048,4096,8000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args()

    be = open_backend(args.model, dtype=args.dtype)
    print(f"model={args.model} dtype={args.dtype} threads={torch.get_num_threads()} torch={torch.__version__}")
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        row = measure(be, size, args.repeats)
        rows.append(row)
        n, d, t_re, t_ru, t_lb, build_s = row
        print(f"{n:>6} tokens ({d} docs): recompute {t_re:.3f}s  reuse {t_ru:.3f}s  "
              f"lower bound {t_lb:.3f}s  speedup {t_re / t_ru:.1f}x  reuse/bound {t_ru / t_lb:.2f}  "
              f"(one-time caching {build_s:.2f}s)", flush=True)
    print("\n| prompt tokens | docs | recompute s | reuse s | lower bound s | recompute/reuse | reuse/bound |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, d, a, b, c, _ in rows:
        print(f"| {n} | {d} | {a:.3f} | {b:.3f} | {c:.3f} | {a / b:.1f}x | {b / c:.2f} |")


if __name__ == "__main__":
    main()
