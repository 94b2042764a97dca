"""Workload replay on the GPU: recompute, prefix caching and segment reuse under one budget, side by
side, through the same code as ``kvaudit replay`` (one engine per policy).

On the lent H200 (shared/gpu): Llama-3.1-8B shape with dummy bf16 weights (SmolLM2's tokenizer),
the default workload shape (10 documents of median 2K tokens per request, Zipfian popularity),
CUDA graphs unless ``--eager``. Prints per policy: TTFT p50/p95 with intervals, throughput, the
measured token hit rate, simulate's and the engine-order prediction, and the request length at
which segment reuse's median TTFT beats prefix caching's.

    source /tmp/gpu-env.sh; python3 benchmarks/replay_gpu.py --requests 120 --budget 10GB --json $OUT/replay.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_ttft import make_shape  # noqa: E402

from kvaudit.core.dataset_format import DEFAULT_SYSTEM  # noqa: E402
from kvaudit.core.replay_format import ReplayConfig, ReplayDir  # noqa: E402
from kvaudit.generators.workload import WorkloadParams, generate, write_workload  # noqa: E402
from kvaudit.replay.serve import engine_kv_bytes, prompt_maker, replay  # noqa: E402
from kvaudit.replay.summary import summarise  # noqa: E402
from kvaudit.replay.workload_text import SyntheticText, read_workload, request_cases  # noqa: E402
from kvaudit.simulator.kv_bytes import parse_capacity, resolve_model  # noqa: E402


def one(policy: str, args: argparse.Namespace, folder: Path, wl: Path, work: Path) -> dict:
    from kvaudit.runners.engines.vllm.backend import open_vllm_backend

    requests = read_workload(wl)
    bpt = resolve_model(str(folder), args.dtype).bytes_per_token
    longest = max(sum(p.tokens for p in r.pieces) for r in requests) + 64
    block = 16
    fit = -(-(longest + 1) // block) * block
    kv = engine_kv_bytes(args.budget, args.concurrency, longest, bpt, block) if policy == "prefix" \
        else max(fit * bpt * args.concurrency * 2, 8 << 30)
    opts = {"load_format": "dummy", "block_size": block, "gpu_memory_utilization": 0.92,
            "disable_log_stats": False}  # vLLM's request stats: its own first-token time beside the client's
    if not args.eager:
        opts.update(max_num_seqs=16, compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16]})
    t0 = time.perf_counter()
    backend = open_vllm_backend(str(folder), dtype=args.dtype, max_new_tokens=1, max_model_len=fit,
                                kv_cache_bytes=kv, cache_bytes=args.budget, enforce_eager=args.eager,
                                concurrent_cases=args.concurrency, **opts)
    open_s = time.perf_counter() - t0
    try:
        out = ReplayDir(work / policy)
        cfg = ReplayConfig(workload=str(wl), workload_hash="bench", policy=policy, budget_bytes=args.budget,
                           model=f"{args.shape} (dummy)", backend="vllm", concurrency=args.concurrency,
                           max_new_tokens=1, n_requests=len(requests))
        out.path.mkdir(parents=True, exist_ok=True)
        out.write_config(cfg)
        synth = SyntheticText(backend.tok.tok)
        todo = [(r.index, r.id, prompt_maker(c, s, backend))
                for r, (c, s) in zip(requests, request_cases(requests, synth), strict=True)]
        template_len = len(backend.tok.head_ids(DEFAULT_SYSTEM, ""))
        t0 = time.perf_counter()
        replay(backend, policy, todo, out, concurrency=args.concurrency, template_len=template_len)
        wall = time.perf_counter() - t0
        engine = {"backend": "vllm", "block_size": block, "bytes_per_token": backend.bytes_per_token(),
                  "kv_tokens": backend.kv_cache_tokens(), "stores_heads": True, "open_s": open_s, "wall_s": wall,
                  "mode": "eager" if args.eager else "graphs"}
        return summarise(out.read_requests(), cfg, engine)
    finally:
        backend.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-3.1-8b")
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--budget", type=parse_capacity, default=parse_capacity("10GB"))
    ap.add_argument("--policies", default="recompute,prefix,segment")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--doc-tokens", default="lognormal:2000:0.5")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvaudit-replay-gpu-"))
    folder = work / "model"
    make_shape(folder, "llama3-8b")
    params = replace(WorkloadParams(), requests=args.requests, doc_tokens=args.doc_tokens, seed=args.seed)
    wl = work / "workload.jsonl"
    write_workload(wl, generate(params), params)
    results = {}
    for policy in args.policies.split(","):
        results[policy] = s = one(policy, args, folder, wl, work)
        t, h = s["ttft_s"], s["hit_rate"]
        eo = h.get("gap_points_engine_order")
        print(f"{policy:<10} p50 {1e3 * t['p50']['value']:8.1f} ms [{1e3 * (t['p50']['low'] or 0):.1f}, "
              f"{1e3 * (t['p50']['high'] or 0):.1f}]  p95 {1e3 * t['p95']['value']:8.1f} ms  "
              f"{s['throughput']['requests_per_s']:.2f} req/s  hit {100 * h['measured']['token_hit_rate']:.1f}% "
              f"sim {100 * h['simulated']['token_hit_rate']:.1f}% (gap {h['gap_points']:+.1f}"
              f"{'' if eo is None else f', engine order {eo:+.1f}'})  open {s['engine']['open_s']:.0f}s "
              f"wall {s['engine']['wall_s']:.0f}s", flush=True)
        co = s.get("client_overhead_s")
        if co:
            print(f"{'':<10} client over vLLM's own first-token time: median {1e3 * co['p50']:.2f} ms, "
                  f"p95 {1e3 * co['p95']:.2f} ms, max {1e3 * co['max']:.2f} ms", flush=True)
    if "prefix" in results and "segment" in results:
        print("\nmedian TTFT by request length (ms): prefix vs segment")
        for a, b in zip(results["prefix"]["ttft_by_length"], results["segment"]["ttft_by_length"], strict=False):
            print(f"  {a['tokens_low']:>6}-{a['tokens_high']:<6} prefix {1e3 * a['ttft_p50_s']:8.1f}  "
                  f"segment {1e3 * b['ttft_p50_s']:8.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
