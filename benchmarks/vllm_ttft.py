"""vLLM time to first token: recompute vs prefix cache (warm) vs segment reuse, side by side.

For prompts of about 2K, 4K and 8K tokens it builds the same documents behind two different
prefixes (A, then B) and measures request B, on one engine and the same ids:

- recompute: a full prefill (fresh cache salt, so nothing is cached);
- prefix cache warm: request A ran first under the same salt, so vLLM's automatic prefix cache
  holds the documents, but behind prefix A: B hits only the blocks before the prefixes differ;
- reuse: the documents' neutral KV (built once, not timed) loaded by kvaudit's connector,
  re-rotated, after B's head (prefilled fresh by its own request, timed); vLLM computes the tail.

Medians of ``--repeats`` runs, with ``num_cached_tokens`` and the speed-ups. ``--agreement``
also prints transformers recompute vs vLLM recompute on the example dataset (same ids);
``--controls N`` runs N Boxoffice cases through recompute, recompute_again (batched with a filler
request), identity and prefix_cache_cold then prefix_cache (warm) and prints the backend's noise floor and the
cold/warm flip rate.
Run by hand, in the vLLM environment, on a machine as quiet as you can get:
    .venv-vllm/bin/python benchmarks/vllm_ttft.py [--sizes 2048,4096,8000] [--repeats 3] [--agreement]

GPU mode (``--model DIR``: a config folder served with ``load_format="dummy"``; ``--make-shape
llama3-8b`` writes Llama-3.1-8B's config and SmolLM2's tokenizer there first) adds the full
prefix-cache hit of the same ids (the in-engine bound for any reuse), splits reuse into its head
request and its main request, reads the connector's load kernel time (CUDA events) and prints the
issue's target (reuse <= 1.3 x full hit + 5 ms) beside each row:
    python3 benchmarks/vllm_ttft.py --model /tmp/l8b --make-shape llama3-8b --dtype bfloat16 \
        --sizes 4096,8192,16384,32768 --repeats 5 [--no-enforce-eager] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from kvaudit.core.arms import get_arm
from kvaudit.core.dataset_format import Case, Segment, segment_id
from kvaudit.runners.engines.transformers.backend import Decoding
from kvaudit.runners.engines.vllm.backend import open_vllm_backend
from kvaudit.runners.prompt import assemble

WORDS = ("film studio director budget premiere audience critic sequel camera script actor festival "
         "release gross ticket season drama comedy thriller archive reel score editor producer").split()


def make_docs(backend, target_tokens: int, seed: int) -> dict[str, Segment]:
    rng = random.Random(seed)
    n_docs = 2 if target_tokens <= 2048 else 4
    per_doc = (target_tokens - 80) // n_docs
    segs = {}
    for k in range(n_docs):
        sents = [f"Document {k}."]
        while len(backend.tok.unit_ids(" ".join(sents))) < per_doc:
            sents.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + ".")
        text = " ".join(sents)
        segs[segment_id(text)] = Segment(segment_id(text), text)
    return segs


def case_with(prefix: str, segs: dict[str, Segment], size: int) -> Case:
    return Case(id=f"bench-{size}-{prefix[:8]}", task="single_doc", segment_ids=list(segs),
                question="Which document mentions a festival first?", answers=["x"], prefix=prefix)


def bench_size(backend: Any, size: int, repeats: int) -> dict:
    segs = make_docs(backend, size, size)
    a = assemble(case_with("Session A-1187, user Ana, 2026-11-30.\n", segs, size), segs, backend.tok,
                 backend.max_prompt_tokens)
    b = assemble(case_with("Session B-5521, user Bo, 2026-12-01.\n", segs, size), segs, backend.tok,
                 backend.max_prompt_tokens)
    backend.neutral_entries([b])  # one-time caching, not timed
    rec, pc, reuse, cached, head, load, full, full_cached, kernel = [], [], [], [], [], [], [], [], []
    for _ in range(repeats):
        rec.append(backend.run_arm(b, get_arm("recompute")).result.ttft_s)
        salt = uuid.uuid4().hex
        backend._one(a.ids, salt=salt, max_tokens=1)  # the documents enter the prefix cache behind A
        warm = backend._one(b.ids, salt=salt, max_tokens=1)
        pc.append(warm.ttft_s)
        cached.append(warm.num_cached_tokens)
        hit = backend._one(b.ids, salt=salt, max_tokens=1)  # the same ids again: a full hit
        full.append(hit.ttft_s)
        full_cached.append(hit.num_cached_tokens)
        out = backend.run_arm(b, get_arm("reuse"))
        reuse.append(out.result.ttft_s)
        head.append(out.head_s)
        st = backend.store_rpc("stats")
        load.append(st["last_load_s"])
        kernel.append(st["last_load_kernel_s"] if st["last_load_kernel_s"] is not None else float("nan"))
    med = statistics.median
    return {"size": len(b.ids), "segment_tokens": b.tail_start - b.head_len, "head_tokens": b.head_len,
            "tail_tokens": len(b.ids) - b.tail_start,
            "recompute": med(rec), "prefix_warm": med(pc), "prefix_cached_tokens": int(med(cached)),
            "full_hit": med(full), "full_hit_cached_tokens": int(med(full_cached)),
            "reuse": med(reuse), "reuse_head": med(head), "reuse_main": med(r - h for r, h in zip(reuse, head)),
            "reuse_load": med(load), "reuse_load_kernel": med(kernel),
            "loaded_bytes": (b.tail_start) * backend.bytes_per_token(),
            "raw": {"recompute": rec, "prefix_warm": pc, "full_hit": full, "reuse": reuse, "reuse_head": head,
                    "load_host": load, "load_kernel": kernel}}


def agreement(backend) -> None:
    """transformers recompute vs vLLM recompute on the example dataset's ids."""
    from pathlib import Path

    import torch

    from kvaudit.core.dataset_format import read_dataset
    from kvaudit.runners.engines.transformers.backend import open_backend

    ds = read_dataset(Path(__file__).resolve().parents[1] / "kvaudit" / "data" / "example")
    tb = open_backend("smollm2", max_new_tokens=backend.decoding.max_new_tokens)
    print(f"\n{'case':<8} {'tokens':>6} {'top1':>5} {'answer':>7} {'max|dlogprob| top5':>19}")
    same_top, same_ans = 0, 0
    for case in ds.cases:
        p = assemble(case, ds.segments, backend.tok, backend.max_prompt_tokens)
        tv = backend.run_arm(p, get_arm("recompute"))
        tt = tb.run_arm(p, get_arm("recompute"))
        t_lp = torch.log_softmax(tt.first_logits, -1)
        top5 = [i for i, _ in tv.result.top_k]
        d = max(abs(float(t_lp[i]) - tv.first_logits[i].item()) for i in top5)
        st = tv.result.top_k[0][0] == tt.result.top_k[0][0]
        sa = tv.result.answer == tt.result.answer
        same_top += st
        same_ans += sa
        print(f"{case.id:<8} {len(p.ids):>6} {'same' if st else 'DIFF':>5} {'same' if sa else 'DIFF':>7} {d:>19.2e}")
    print(f"top-1 agreement {same_top}/{len(ds.cases)}, answer agreement {same_ans}/{len(ds.cases)}")


def controls(backend, n_cases: int) -> None:
    """Noise floor, identity and prefix-cache cold/warm flips on generated Boxoffice cases."""
    import tempfile

    from kvaudit.cli import main as kvaudit_main
    from kvaudit.core.dataset_format import read_dataset

    backend.decoding = Decoding(max_new_tokens=16)  # whole short answers, so flips can show
    with tempfile.TemporaryDirectory() as tmp:
        kvaudit_main(["generate", "boxoffice", "--out", tmp, "--cases", str(n_cases), "--seed", "11"])
        ds = read_dataset(tmp)
    again_d, ident_d, again_flips, ident_flips, pc_flips, pc_d = [], [], 0, 0, 0, []
    for case in ds.cases:
        p = assemble(case, ds.segments, backend.tok, backend.max_prompt_tokens)
        ref = backend.run_arm(p, get_arm("recompute"))
        again = backend.run_arm(p, get_arm("recompute_again"))
        ident = backend.run_arm(p, get_arm("identity"))
        cold = backend.run_arm(p, get_arm("prefix_cache_cold")).result
        warm = backend.run_arm(p, get_arm("prefix_cache")).result
        again_d.append(float((again.first_logits - ref.first_logits).abs().max()))
        ident_d.append(float((ident.first_logits - ref.first_logits).abs().max()))
        pc_d.append(max(abs(a[1] - b[1]) for a, b in zip(cold.top_k, warm.top_k)))
        again_flips += again.result.answer != ref.result.answer
        ident_flips += ident.result.answer != ref.result.answer
        pc_flips += cold.answer != warm.answer
    n = len(ds.cases)
    print(f"\ncontrols on {n} Boxoffice cases (max |first-token log-prob diff|, answer flips):")
    print(f"  recompute_again vs recompute: max {max(again_d):.2e}, flips {again_flips}/{n}")
    print(f"  identity vs recompute:        max {max(ident_d):.2e}, flips {ident_flips}/{n}")
    print(f"  prefix cache warm vs cold:    max {max(pc_d):.2e} (top-5), flips {pc_flips}/{n}")


LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
}

# The same architecture, two small layers: runs the GPU scripts end to end on a CPU before device time is spent on them
TINY = {**LLAMA31_8B, "vocab_size": 49152, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "torch_dtype": "float32"}
SHAPES = {"llama3-8b": LLAMA31_8B, "tiny": TINY}


def make_shape(folder: Path, shape: str) -> None:
    """A served-with-dummy-weights model folder: the shape's config.json and SmolLM2's tokenizer."""
    from transformers import AutoTokenizer

    from kvaudit.models import smollm2_gguf_path

    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tokenizer_config.json").exists():
        gguf = smollm2_gguf_path()
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    cfg = dict(SHAPES[shape])
    for k in ("bos_token", "eos_token"):  # ids the SmolLM2 tokenizer really has
        name = tok.get(k)
        if isinstance(name, str):
            cfg[f"{k}_id"] = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(name)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))


def print_gpu_table(rows: list[dict]) -> None:
    print(f"\n{'tokens':>6} {'recompute':>10} {'full hit':>9} {'reuse':>8} {'= head':>7} {'+ main':>7} "
          f"{'load kern':>9} {'GB/s':>6} {'target':>7} {'reuse/hit':>9} {'rec/reuse':>9} {'met':>4}   "
          f"(ms; prefix cache behind another head: cached / ms)")
    for r in rows:
        target = 1.3 * r["full_hit"] + 0.005
        kern = r["reuse_load_kernel"]
        gbs = 2 * r["loaded_bytes"] / kern / 1e9 if kern == kern and kern > 0 else float("nan")
        print(f"{r['size']:>6} {r['recompute'] * 1e3:>10.1f} {r['full_hit'] * 1e3:>9.1f} {r['reuse'] * 1e3:>8.1f} "
              f"{r['reuse_head'] * 1e3:>7.1f} {r['reuse_main'] * 1e3:>7.1f} {kern * 1e3:>9.2f} {gbs:>6.0f} "
              f"{target * 1e3:>7.1f} {r['reuse'] / r['full_hit']:>9.2f} {r['recompute'] / r['reuse']:>8.1f}x "
              f"{'yes' if r['reuse'] <= target else 'no':>4}   {r['prefix_cached_tokens']} / "
              f"{r['prefix_warm'] * 1e3:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=None, help="prompt sizes (default 2048,4096,8000; GPU mode 4K..32K)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--agreement", action="store_true")
    ap.add_argument("--controls", type=int, default=0, metavar="N")
    ap.add_argument("--model", default=None, help="GPU mode: a config folder served with load_format=dummy")
    ap.add_argument("--make-shape", default=None, metavar="SHAPE", help="write SHAPE's config into --model first")
    ap.add_argument("--dtype", default="bfloat16", help="GPU mode dtype (default bfloat16)")
    ap.add_argument("--no-enforce-eager", action="store_true", help="GPU mode: CUDA graphs (and torch.compile)")
    ap.add_argument("--kv-cache-gib", type=float, default=24.0)
    ap.add_argument("--store-gib", type=float, default=16.0)
    ap.add_argument("--json", default=None, help="write the rows (with every repeat) here")
    args = ap.parse_args()
    if args.model is None:
        return cpu_main(args)
    folder = Path(args.model)
    if args.make_shape:
        make_shape(folder, args.make_shape)
    sizes = [int(s) for s in (args.sizes or "4096,8192,16384,32768").split(",") if s.strip()]
    max_len = max(sizes) + 2048
    opts: dict[str, Any] = {"load_format": "dummy"}
    if args.no_enforce_eager:
        opts.update(max_num_seqs=16, compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256]})
    t0 = time.perf_counter()
    backend = open_vllm_backend(str(folder), dtype=args.dtype, max_new_tokens=1, max_model_len=max_len,
                                kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
                                cache_bytes=int(args.store_gib * (1 << 30)),
                                enforce_eager=not args.no_enforce_eager, **opts)
    import torch
    import vllm

    start_s = time.perf_counter() - t0
    print(f"engine start {start_s:.1f}s; vLLM {vllm.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}, {args.dtype}, "
          f"{'CUDA graphs' if args.no_enforce_eager else 'eager'}; KV {backend.bytes_per_token()} bytes/token",
          flush=True)
    rows = []
    for size in sizes:
        rows.append(bench_size(backend, size, args.repeats))
        r = rows[-1]
        print(f"  {r['size']} tokens: recompute {r['recompute'] * 1e3:.1f} ms, full hit {r['full_hit'] * 1e3:.1f} ms, "
              f"reuse {r['reuse'] * 1e3:.1f} ms", flush=True)
    print_gpu_table(rows)
    stats = backend.store_rpc("stats")
    print(f"store: {stats}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "engine_start_s": start_s, "store": stats,
                                               "info": backend.info(), "args": vars(args)}, indent=1, default=str))
    backend.close()


def cpu_main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in (args.sizes or "2048,4096,8000").split(",") if s.strip()]
    t0 = time.perf_counter()
    backend = open_vllm_backend("smollm2", max_new_tokens=1, max_model_len=8192,
                                kv_cache_bytes=1536 << 20)
    print(f"engine start {time.perf_counter() - t0:.1f}s; threads {backend.info()['threads']}")
    print(f"\n{'tokens':>6} {'seg':>5} {'recompute':>10} {'prefix warm':>12} {'(cached)':>9} {'reuse':>8} "
          f"{'rec/reuse':>10} {'pc/reuse':>9}   reuse = head request + rest (connector load)")
    for size in sizes:
        r = bench_size(backend, size, args.repeats)
        print(f"{r['size']:>6} {r['segment_tokens']:>5} {r['recompute']:>9.3f}s {r['prefix_warm']:>11.3f}s "
              f"{r['prefix_cached_tokens']:>9} {r['reuse']:>7.3f}s {r['recompute'] / r['reuse']:>9.1f}x "
              f"{r['prefix_warm'] / r['reuse']:>8.1f}x   {r['reuse_head']:.3f}s + "
              f"{r['reuse'] - r['reuse_head']:.3f}s ({r['reuse_load']:.3f}s)", flush=True)
    if args.agreement:
        agreement(backend)
    if args.controls:
        controls(backend, args.controls)
    backend.close()


if __name__ == "__main__":
    main()
