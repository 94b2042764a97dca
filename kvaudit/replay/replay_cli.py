"""``kvaudit replay``: serve a workload through a backend under one cache policy and a KV budget.

    kvaudit replay --workload W.jsonl --policy segment --budget 200MB --out runs/replay-segment

Writes ``replay_config.json``, ``requests.jsonl`` (one record per request, resumable: rerun the
same command after a kill) and ``replay.json`` (:mod:`kvaudit.replay.summary`), and prints the
TTFT percentiles and the measured hit rate beside the simulator's. docs/replay.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from kvaudit.core.arg_types import byte_size, positive_int
from kvaudit.core.errors import KvauditError
from kvaudit.runners.registry import add_backend_arguments

POLICIES = ("recompute", "prefix", "segment")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True, type=Path, help="workload JSONL (kvaudit generate workload)")
    p.add_argument("--policy", required=True, choices=POLICIES,
                   help="recompute (nothing cached), prefix (the engine's own prefix cache; --backend vllm) "
                        "or segment (kvaudit's segment store with neutral warm-ups)")
    p.add_argument("--budget", required=True, type=byte_size,
                   help="KV bytes the policy may keep cached between requests, e.g. 200MB or 2GiB")
    p.add_argument("--out", required=True, type=Path, help="replay directory (rerun the same command to resume)")
    p.add_argument("--concurrency", type=positive_int, default=1,
                   help="the most requests served together in one wave (default 1)")
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--rate", type=float, default=None, metavar="R",
                      help="open loop: Poisson arrivals at R requests per second (seeded by --seed)")
    loop.add_argument("--timestamps", action="store_true",
                      help="open loop: arrivals at the workload's own timestamps (relative to the first request)")
    p.add_argument("--seed", type=int, default=0, help="seed of --rate's arrivals (default 0)")
    p.add_argument("--model", default="smollm2", help="'smollm2' (default) or a local checkpoint directory")
    add_backend_arguments(p)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--limit", type=positive_int, default=None, help="replay only the first N requests")
    p.add_argument("--max-new-tokens", type=positive_int, default=1,
                   help="tokens generated per request (default 1: the replay measures the time to first token)")
    p.add_argument("--audit-sample", type=positive_int, default=None, metavar="K",
                   help="also write K of the replayed requests, evenly spaced over the workload, as a dataset "
                        "(documents as segments, metric 'agreement' with recompute's answer) for `kvaudit run`: "
                        "the quality cost on the traffic whose speed was measured")
    p.add_argument("--audit-dataset", type=Path, default=None, metavar="DIR",
                   help="where --audit-sample writes the dataset (default OUT/audit_dataset)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _arrivals(args: argparse.Namespace, requests: list[Any]) -> tuple[str, list[float] | None]:
    """The arrival spec recorded in the replay's config, and one arrival time per workload request
    (seconds from the first), or None for the closed loop."""
    from kvaudit.replay.serve import poisson_arrivals

    if args.rate is not None:
        if not args.rate > 0 or args.rate == float("inf"):
            raise KvauditError(f"--rate must be a positive number of requests per second, got {args.rate}")
        return f"poisson:{args.rate}:{args.seed}", poisson_arrivals(len(requests), args.rate, args.seed)
    if args.timestamps:
        missing = [r for r in requests if r.timestamp is None]
        if missing:
            raise KvauditError(f"--timestamps: request {missing[0].id!r} of {args.workload} has no timestamp "
                               f"({len(missing)} of {len(requests)} have none)")
        times = [r.timestamp for r in requests]
        back = next((i for i in range(1, len(times)) if times[i] < times[i - 1]), None)
        if back is not None:
            raise KvauditError(f"--timestamps: request {requests[back].id!r} of {args.workload} arrives before "
                               "the one above it; the replay serves requests in file order")
        return "timestamps", [t - times[0] for t in times]
    return "closed", None


def _engine_facts(backend: Any, dtype: str, model: str) -> dict[str, Any]:
    from kvaudit.models import resolve_model_dir
    from kvaudit.simulator.kv_bytes import resolve_model

    info = backend.info()
    engine = info.get("engine") or {}
    if hasattr(backend, "bytes_per_token"):
        bpt = int(backend.bytes_per_token())
    else:
        bpt = resolve_model(str(resolve_model_dir(model)), dtype).bytes_per_token
    return {
        "backend": info["backend"],
        "device": info.get("device", "cpu"),
        "dtype": info["dtype"],
        "block_size": int(engine.get("block_size", 16)),
        "bytes_per_token": bpt,
        "kv_tokens": int(backend.kv_cache_tokens()) if hasattr(backend, "kv_cache_tokens") else None,
        "stores_heads": bool(getattr(backend, "stores_heads", False)),
        "heads_saved_after_load": bool(getattr(backend, "heads_saved_after_load", False)),
        "max_prompt_tokens": int(backend.max_prompt_tokens),
    }


def _print_summary(s: dict[str, Any], out: Path) -> None:
    t = s["ttft_s"]
    hr = s["hit_rate"]

    def ms(v: dict[str, Any]) -> str:
        lo = "?" if v["low"] is None else f"{1e3 * v['low']:.1f}"
        hi = "?" if v["high"] is None else f"{1e3 * v['high']:.1f}"
        return f"{1e3 * v['value']:.1f} ms [{lo}, {hi}]"

    c = s["config"]
    print(f"\nreplay {c['policy']} at budget {c['budget_bytes']:,} B: {s['requests']} requests "
          f"({s['sessions']} session(s)) in {out}")
    print(f"  TTFT p50 {ms(t['p50'])}  p95 {ms(t['p95'])}  p99 {ms(t['p99'])}")
    m, p = hr["measured"]["token_hit_rate"], hr["simulated"]["token_hit_rate"]
    note = "" if hr["simulator_agrees"] else "  <- the simulator disagrees by more than 2 points (docs/replay.md)"
    print(f"  token hit rate measured {100 * m:.1f}%  simulated {100 * p:.1f}%  gap {hr['gap_points']:+.1f} points{note}")
    if hr.get("simulated_engine_order"):
        print(f"  simulated with the store's operations in the engine's order: "
              f"{100 * hr['simulated_engine_order']['token_hit_rate']:.1f}% "
              f"(gap {hr['gap_points_engine_order']:+.1f} points)")
    co = s.get("client_overhead_s")
    if co:
        print(f"  kvaudit's client over the engine's own first-token time: median {1e3 * co['p50']:.2f} ms, "
              f"p95 {1e3 * co['p95']:.2f} ms ({co['requests']} requests)")
    th = s["throughput"]
    if th["requests_per_s"]:
        print(f"  throughput {th['requests_per_s']:.2f} requests/s, {th['prompt_tokens_per_s']:,.0f} prompt tokens/s")


def run(args: argparse.Namespace) -> int:
    from kvaudit.core.jsonio import check_writable_dir, file_sha256
    from kvaudit.core.progress import progress_bar
    from kvaudit.core.replay_format import ReplayConfig, ReplayDir
    from kvaudit.replay.serve import (
        POLICY_ARM,
        check_waves_fit,
        engine_kv_bytes,
        prompt_maker,
        replay,
        request_kv,
    )
    from kvaudit.replay.summary import summarise
    from kvaudit.replay.workload_text import SyntheticText, read_workload, request_cases
    from kvaudit.runners.registry import BACKENDS, backend_options, check_arms_run_on

    opts = backend_options(args)  # refuse another backend's options before any work
    check_arms_run_on([POLICY_ARM[args.policy]], args.backend)
    if args.policy == "prefix" and args.backend != "vllm":
        raise KvauditError("--policy prefix holds the engine's own prefix cache to --budget; that needs "
                           "--backend vllm (in process)")
    if args.policy == "segment" and args.backend not in ("transformers", "vllm"):
        # Over HTTP, a stock server's "reuse" is its own prefix cache primed by warm-ups (measured here:
        # 12% hit where the segment store would hold 42%), and a connector server's store budget is
        # set when the server starts, out of the replay's reach: neither is the segment policy at --budget.
        raise KvauditError(f"--policy segment needs kvaudit's own segment store under --budget: --backend vllm "
                           f"or transformers (in process), not {args.backend}")
    if "concurrent_cases" in opts:
        opts["concurrent_cases"] = args.concurrency
    if args.backend == "vllm":
        opts["disable_log_stats"] = False  # vLLM's per-request stats: its own TTFT beside the client's
    check_writable_dir(args.out)
    requests = read_workload(args.workload)
    if args.limit:
        requests = requests[: args.limit]
    arrivals_spec, arrivals = _arrivals(args, requests)
    config = ReplayConfig(workload=str(args.workload), workload_hash=file_sha256(args.workload), policy=args.policy,
                          budget_bytes=args.budget, model=args.model, backend=args.backend,
                          concurrency=args.concurrency, max_new_tokens=args.max_new_tokens,
                          n_requests=len(requests), arrivals=arrivals_spec)
    out = ReplayDir(args.out)
    with out.lock("replay", create=True):
        out.check_resumable(config)
        done = {r.index for r in out.finished()}
        todo_requests = [r for r in requests if r.index not in done]
        if not todo_requests and out.summary_file.is_file():  # nothing left to serve: the summary stands
            _print_summary(out.read_summary(), args.out)
            return 0
        common: dict[str, Any] = {"dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
                                  "cache_bytes": args.budget}
        if args.policy == "prefix":
            from kvaudit.models import resolve_model_dir
            from kvaudit.simulator.kv_bytes import resolve_model

            bpt = resolve_model(str(resolve_model_dir(args.model)), args.dtype).bytes_per_token
            longest = max(sum(p.tokens for p in r.pieces) for r in requests) + 64  # + the chat template
            block = int(opts.get("block_size", 32))
            opts["kv_cache_bytes"] = engine_kv_bytes(args.budget, args.concurrency, longest, bpt, block)
            # vLLM refuses a KV space smaller than one request of max_model_len: the replay's longest
            # request (and its answer) is what it must fit, so the engine is opened for that.
            fit = -(-(longest + args.max_new_tokens) // block) * block
            opts["max_model_len"] = min(int(opts.get("max_model_len", fit)), fit)
        backend = BACKENDS[args.backend].open(args.model, **common, **opts)
        try:
            engine = _engine_facts(backend, args.dtype, args.model)
            hf_tok = backend.tok.tok
            synth = None if all(p.text is not None for r in todo_requests for p in r.pieces) else SyntheticText(hf_tok)
            from kvaudit.core.dataset_format import DEFAULT_SYSTEM

            template_len = len(backend.tok.head_ids(DEFAULT_SYSTEM, ""))
            todo = [(r.index, r.id, prompt_maker(case, segs, backend))
                    for r, (case, segs) in zip(todo_requests, request_cases(todo_requests, synth), strict=True)]
            if args.policy == "segment":  # every wave's segment KV must fit: refused now, not mid-replay
                check_waves_fit([request_kv(make(), engine["stores_heads"]) for _, _, make in todo],
                                [rid for _, rid, _ in todo], concurrency=args.concurrency,
                                open_loop=arrivals is not None, bytes_per_token=engine["bytes_per_token"],
                                store_bytes=int(getattr(backend, "store_bytes", args.budget)), budget=args.budget)
            out.write_config(config)
            bar = progress_bar(total=len(todo), desc=f"replay {args.policy}", unit="request",
                               enabled=not args.no_progress)
            t0 = time.perf_counter()
            if arrivals is not None:  # a resumed session starts its clock at its first request's arrival
                times = [arrivals[r.index] for r in todo_requests]
                arrivals = [t - times[0] for t in times] if times else []
            replay(backend, args.policy, todo, out, concurrency=args.concurrency, template_len=template_len,
                   on_wave=bar.update, arrivals=arrivals)
            bar.close()
            engine["wall_s_last_session"] = time.perf_counter() - t0
        finally:
            close = getattr(backend, "close", None)
            if close is not None:
                close()
        summary = summarise(out.read_requests(), config, engine)
        out.write_summary(summary)
    _print_summary(summary, args.out)
    if args.audit_sample:
        write_audit_sample(requests, args.audit_sample, args.audit_dataset or Path(args.out) / "audit_dataset",
                           synth, args)
    return 0


def write_audit_sample(requests: list[Any], k: int, out: Path, synth: Any, args: argparse.Namespace) -> None:
    """K requests, evenly spaced over the workload, as a dataset with the texts the replay served.
    The replay's requests carry no gold answers: the cases' metric is ``agreement`` (an arm's
    answer scored against recompute's on the same ids), so the quality cost is what reuse changes."""
    from kvaudit.generators.writing import finish
    from kvaudit.replay.workload_text import request_cases

    k = min(k, len(requests))
    picked = [requests[round(i * (len(requests) - 1) / max(1, k - 1))] for i in range(k)] if k > 1 else requests[:1]
    picked = list({r.index: r for r in picked}.values())
    segments: dict[str, Any] = {}
    cases = []
    for case, segs in request_cases(picked, synth):
        case.metric = "agreement"
        case.answers = []
        case.evidence = list(case.segment_ids)
        segments.update(segs)
        cases.append(case)
    finish(out, generator="replay-sample", seed=None,
           params={"workload": str(args.workload), "policy": args.policy, "audit_sample": k},
           segments=segments, cases=cases, quiet=True)
    print(f"  audit sample: {len(cases)} requests as a dataset in {out} (kvaudit run --dataset {out} ...)")
