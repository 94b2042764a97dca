"""Workload replay on the GPU: recompute, prefix caching and segment reuse under one budget, side by
side, through the same code as ``kvaudit replay`` (one engine per policy).

On the lent H200 (shared/gpu): Llama-3.1-8B shape with dummy bf16 weights (SmolLM2's tokenizer),
the default workload shape (10 documents of median 2K tokens per request, Zipfian popularity),
CUDA graphs unless ``--eager``. Prints per policy: TTFT p50/p95 with intervals, throughput, the
measured token hit rate, simulate's and the engine-order prediction, and the request length at
which segment reuse's median TTFT beats prefix caching's.

    source /tmp/gpu-env.sh; python3 benchmarks/replay_gpu.py --requests 120 --cache-budget 10GB --json $OUT/replay.json

``--rates R1,R2,...`` serves each policy at those offered loads instead (Poisson arrivals, seeded),
on one engine per policy with empty caches at each load, each request joining the running batch
at its arrival (``kvaudit replay --schedule arrivals``): TTFT p50/p95/p99 against offered load,
and with ``--slo-ttft S`` the highest load whose p95 stays within S seconds, per policy.

    source /tmp/gpu-env.sh; python3 benchmarks/replay_gpu.py --policies segment --rates 0.5,1,2 --cache-budget 40GB

``--replications K`` serves each load K times with arrival seeds SEED..SEED+K-1 (``kvaudit replay
--replications``): per load the median p50/p95/p99 over the replications with intervals that hold
though requests queue (both ends from 6), and the SLO reading on those. With ``--work DIR`` each
policy's loads are a sweep as ``kvaudit replay --rate`` writes it (``DIR/POLICY/sweep.json``, a
``replay.json`` per load), so ``kvaudit compare DIR/prefix DIR/segment --slo-ttft S`` draws the page.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_ttft import make_shape  # noqa: E402

from kvaudit.core.dataset_format import DEFAULT_SYSTEM  # noqa: E402
from kvaudit.core.jsonio import write_atomic  # noqa: E402
from kvaudit.core.replay_format import ReplayConfig, ReplayDir, poisson_spec  # noqa: E402
from kvaudit.generators.workload import WorkloadParams, generate, write_workload  # noqa: E402
from kvaudit.replay.replay_cli import write_sweep  # noqa: E402
from kvaudit.replay.serve import (  # noqa: E402
    poisson_arrivals,
    prompt_maker,
    replay,
    replay_kv_bytes,
    replay_scheduled,
    store_budget,
    stored_bytes_per_token,
)
from kvaudit.replay.summary import load_across_replications, served_here, summarise  # noqa: E402
from kvaudit.replay.workload_text import (  # noqa: E402
    SyntheticText,
    longest_request_tokens,
    read_workload,
    request_cases,
)
from kvaudit.simulator.kv_bytes import parse_capacity, resolve_model  # noqa: E402
from kvaudit.stats.saturation import highest_sustained  # noqa: E402


def one(policy: str, args: argparse.Namespace, folder: Path, wl: Path, work: Path,
        on_load: Callable[[list[dict]], None]) -> dict | list[dict]:
    from kvaudit.runners.engines.vllm.backend import open_vllm_backend

    requests = read_workload(wl)
    bpt = stored_bytes_per_token(resolve_model(str(folder), args.dtype).bytes_per_token, args.dtype,
                                 args.vllm_option.get("kv_cache_dtype"))
    longest = longest_request_tokens(requests)
    block = args.block_size
    fit = -(-(longest + args.max_new_tokens) // block) * block
    # sized as kvaudit replay sizes it (until 2026-12-05 segment reuse got twice the requests in flight
    # and at least 8 GiB: 68 GB at the default shape, more than an H100 holds beside its store)
    kv = replay_kv_bytes(policy, args.budget, args.concurrency, longest, bpt, block, kv_space=args.kv_space)
    opts = {"load_format": "dummy", "block_size": block, "gpu_memory_utilization": 0.92,
            "disable_log_stats": False}  # vLLM's request stats: its own first-token time beside the client's
    if not args.eager:
        opts.update(max_num_seqs=16, compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16]})
    if args.rates:
        opts["max_num_seqs"] = args.concurrency  # arrivals: what the engine runs at once
    if args.max_new_tokens > 1:
        opts["measure_decode"] = True  # dummy weights: decode every token asked, EOS or not
    opts.update(args.vllm_option)  # a serving change under load (e.g. kv_cache_dtype=fp8)
    t0 = time.perf_counter()
    backend = open_vllm_backend(str(folder), dtype=args.dtype, max_new_tokens=args.max_new_tokens, max_model_len=fit,
                                kv_cache_bytes=kv, cache_bytes=store_budget(policy, args.budget), enforce_eager=args.eager,
                                concurrent_cases=args.concurrency, **opts)
    open_s = time.perf_counter() - t0
    # replays ask no log-probabilities; --ask-logprobs 20: as they did before 8677ace, side by side
    backend.asks_logprobs = bool(args.ask_logprobs)
    try:
        out = ReplayDir(work / policy)
        cfg = ReplayConfig(workload=str(wl), workload_hash="bench", policy=policy, budget_bytes=args.budget,
                           model=f"{args.shape} (dummy)", backend="vllm", concurrency=args.concurrency,
                           max_new_tokens=args.max_new_tokens, n_requests=len(requests), kv_space_bytes=args.kv_space)
        out.path.mkdir(parents=True, exist_ok=True)
        out.write_config(cfg)
        synth = SyntheticText(backend.tok.tok)
        todo = [(r.index, r.id, prompt_maker(c, s, backend))
                for r, (c, s) in zip(requests, request_cases(requests, synth), strict=True)]
        template_len = len(backend.tok.head_ids(DEFAULT_SYSTEM, ""))
        engine = {"backend": "vllm", "block_size": block, "bytes_per_token": backend.bytes_per_token(),
                  "kv_tokens": backend.kv_cache_tokens(), "stores_heads": True, "open_s": open_s,
                  "mode": "eager" if args.eager else "graphs", "heads_saved_after_load": True,
                  "ask_logprobs": args.ask_logprobs}
        if args.rates:
            loads: list[dict] = []
            for rate in args.rates:  # each load saved as it ends: a long sweep keeps what it measured
                for seed in range(args.seed, args.seed + args.replications):
                    loads.append(at_rate(backend, policy, rate, seed, todo, requests, cfg, engine, work, template_len,
                                         args))
                    on_load(loads)
                    write_sweep(work / policy, [(r, [(x["seed"], x["dir"], x) for x in loads if x["rate"] == r])
                                                for r in dict.fromkeys(x["rate"] for x in loads)])
            return loads
        t0 = time.perf_counter()
        replay(backend, policy, todo, out, concurrency=args.concurrency, template_len=template_len,
               head_block=block if policy == "prefix" else 0)
        engine["wall_s"] = time.perf_counter() - t0
        return summarise(out.read_requests(), cfg, engine)
    finally:
        backend.close()


def at_rate(backend, policy: str, rate: float, seed: int, todo: list, requests: list, cfg: ReplayConfig,
            engine: dict, work: Path, template_len: int, args: argparse.Namespace) -> dict:
    """One offered load (one arrival seed) on the open engine, caches emptied first; its summary
    with the rate and seed."""
    backend.reset_caches()
    out = ReplayDir(work / policy / (f"rate-{rate:g}" + (f"-seed-{seed}" if args.replications > 1 else "")))
    out.path.mkdir(parents=True, exist_ok=True)
    c = replace(cfg, arrivals=poisson_spec(rate, seed), schedule=args.schedule)
    out.write_config(c)
    t0 = time.perf_counter()
    arrivals = poisson_arrivals(len(requests), rate, seed)
    head_block = engine["block_size"] if policy == "prefix" else 0
    replay_scheduled(backend, policy, todo, out, schedule=args.schedule, arrivals=arrivals,
                     concurrency=args.concurrency, template_len=template_len, head_block=head_block)
    s = summarise(out.read_requests(), c, {**engine, "wall_s": time.perf_counter() - t0})
    s["served"] = served_here()
    out.write_summary(s)  # what kvaudit replay writes: the folder opens in kvaudit compare
    s = {**s, "rate": rate, "seed": seed, "schedule": args.schedule, "dir": out.path.name,
         "vllm_options": args.vllm_option}
    t, h, co = s["ttft_s"], s["hit_rate"], s.get("client_overhead_s") or {}
    print(f"{policy:<10} {args.schedule:<8} offered {rate:5g}/s seed {seed} served {s['throughput']['requests_per_s']:.2f}/s  TTFT p50 "
          f"{_ms(t['p50'])}  p95 {_ms(t['p95'])}  p99 {1e3 * t['p99']['value']:8.1f} ms  hit "
          f"{100 * h['measured']['token_hit_rate']:.1f}% (engine order {h.get('gap_points_engine_order') or 0:+.1f})"
          f"  overflow {h.get('overflow_tokens', 0):,} tok  client over vLLM: median "
          f"{1e3 * co.get('p50', float('nan')):.2f} ms p95 {1e3 * co.get('p95', float('nan')):.2f} ms (after vLLM's "
          f"first-token stamp: p95 {1e3 * (co.get('after_engine') or {}).get('p95', float('nan')):.2f} ms)  TTFT growth "
          f"{(s.get('ttft_growth') or {}).get('slope', float('nan')):+.3f} s/s"
          f"{' PAST SATURATION' if (s.get('ttft_growth') or {}).get('past_saturation') else ''}", flush=True)
    return s


def _ms(v: dict) -> str:
    """A percentile with its interval in milliseconds ("?" for an open end)."""
    lo = "?" if v["low"] is None else f"{1e3 * v['low']:.1f}"
    hi = "?" if v["high"] is None else f"{1e3 * v['high']:.1f}"
    return f"{1e3 * v['value']:8.1f} ms [{lo}, {hi}]"


def vllm_option(text: str) -> tuple[str, object]:
    """``KEY=JSON`` (a bare word is a string): one vllm.LLM engine argument."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-3.1-8b", help="llama-3.1-8b, or tiny (two small layers: a CPU smoke run)")
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--cache-budget", "--budget", dest="budget", type=parse_capacity, default=parse_capacity("10GB"))
    ap.add_argument("--kv-space", type=parse_capacity, default=None,
                    help="the engine's KV space for requests in flight, as `kvaudit replay --kv-space` (default: "
                         "--concurrency of the longest request, so none waits for space)")
    ap.add_argument("--vllm-option", type=vllm_option, action="append", default=[], metavar="KEY=JSON",
                    help="an engine argument of vllm.LLM for every policy's engine (a serving change under load), "
                         "e.g. kv_cache_dtype='\"fp8\"'; repeatable")
    ap.add_argument("--policies", default="recompute,prefix,segment")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--doc-tokens", default="lognormal:2000:0.5")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--block-size", type=int, default=16, help="the engine's KV block (16 on the GPU; 32 on a CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")], default=None,
                    help="offered loads (requests/s), each request served at its arrival")
    ap.add_argument("--replications", type=int, default=1,
                    help="with --rates: serve each load this many times with new arrival seeds (6 bounds both ends "
                         "of each load's p95 interval)")
    ap.add_argument("--max-new-tokens", type=int, default=1, help="tokens each request decodes (default 1)")
    ap.add_argument("--schedule", choices=("arrivals", "waves"), default="arrivals",
                    help="with --rates: each request joins the running batch at its arrival (default), or "
                         "served in waves of --concurrency (an arrival waits for the running wave)")
    ap.add_argument("--ask-logprobs", type=int, default=0, choices=(0, 20),
                    help="20: every request asks the sampler for its top-20 log-probabilities, as an audit's requests "
                         "do (replays ask none): the cost of asking, measured side by side")
    ap.add_argument("--slo-ttft", type=float, default=None, help="seconds: the highest load whose p95 TTFT is within")
    ap.add_argument("--json", type=Path, help="the summaries, rewritten after each offered load")
    ap.add_argument("--work", type=Path, default=None,
                    help="keep the workload and each load's replay directory (requests.jsonl) here")
    args = ap.parse_args()
    args.vllm_option = dict(args.vllm_option)
    work = args.work or Path(tempfile.mkdtemp(prefix="kvaudit-replay-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = work / "model"
    make_shape(folder, {"llama-3.1-8b": "llama3-8b"}.get(args.shape, args.shape))
    params = replace(WorkloadParams(), requests=args.requests, doc_tokens=args.doc_tokens, seed=args.seed)
    wl = work / "workload.jsonl"
    write_workload(wl, generate(params), params)
    results: dict = {}

    def save() -> None:
        if args.json:
            write_atomic(args.json, json.dumps(results, indent=1))

    def on_load(policy: str) -> Callable[[list[dict]], None]:
        def saved(loads: list[dict]) -> None:
            results[policy] = loads
            save()
        return saved

    for policy in args.policies.split(","):
        got = one(policy, args, folder, wl, work, on_load(policy))
        if isinstance(got, list):
            results[policy] = got
            by_load = [load_across_replications([s for s in got if s["rate"] == r]) | {"rate": r} for r in args.rates]
            results[f"{policy}_loads"] = by_load
            save()
            if args.replications > 1:
                for x in by_load:
                    past = "  PAST SATURATION" if (x["ttft_growth"] or {}).get("past_saturation") else ""
                    print(f"{policy:<10} offered {x['rate']:5g}/s, {x['replications']} replications: "
                          + "  ".join(f"{q} {_ms(v)}" for q, v in x["ttft_s"].items()) + past, flush=True)
            if args.slo_ttft is not None:
                ok = highest_sustained([{"rate": x["rate"], "p95_s": x["ttft_s"]["p95"]["value"],
                                         "past_saturation": (x["ttft_growth"] or {}).get("past_saturation")}
                                        for x in by_load], args.slo_ttft)
                print(f"{policy:<10} highest offered load with p95 TTFT within {args.slo_ttft:g} s, the server "
                      f"keeping up: {'none of those measured' if ok is None else ok}", flush=True)
            continue
        results[policy] = s = got
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
    if "prefix" in results and "segment" in results:  # one table, or one per offered load
        pairs = (zip(results["prefix"], results["segment"], strict=True) if args.rates
                 else [(results["prefix"], results["segment"])])
        for a_s, b_s in pairs:
            at = f" at {a_s['rate']:g}/s" if args.rates else ""
            print(f"\nmedian TTFT by request length{at} (ms): prefix vs segment")
            for a, b in zip(a_s["ttft_by_length"], b_s["ttft_by_length"], strict=False):
                print(f"  {a['tokens_low']:>6}-{a['tokens_high']:<6} prefix {1e3 * a['ttft_p50_s']:8.1f}  "
                      f"segment {1e3 * b['ttft_p50_s']:8.1f}")
    save()


if __name__ == "__main__":
    from kvaudit.core.errors import KvauditError

    try:
        main()
    except KvauditError as e:  # a refusal (the store's room, a request that does not fit): exit 2, as the CLI
        print(f"replay_gpu.py: {e}", file=sys.stderr)
        sys.exit(2)
