"""`kvaudit run`: every case of a dataset under every chosen arm, resumable."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvaudit.core.arms import ARMS, DEFAULT_ARMS


def parse_bytes(text: str) -> int:
    units = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGTIB")
    unit = t[len(num):]
    if unit not in units or not num:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 2GiB or 500MB)")
    return int(float(num) * units[unit])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, type=Path, help="dataset directory (segments.jsonl, cases.jsonl)")
    p.add_argument("--out", required=True, type=Path, help="run directory (rerun the same command to resume)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help=f"comma-separated arms from: {', '.join(ARMS)} (default: %(default)s)")
    p.add_argument("--model", default="smollm2", help="'smollm2' (default) or a local checkpoint directory")
    p.add_argument("--backend", default="transformers", choices=["transformers", "vllm"],
                   help="transformers (default) or vllm (needs the vllm extra; see docs/vllm.md)")
    eng = p.add_argument_group("vLLM engine options (with --backend vllm; recorded in the manifest)")
    eng.add_argument("--tensor-parallel-size", type=int, default=1)
    eng.add_argument("--pipeline-parallel-size", type=int, default=1)
    eng.add_argument("--max-model-len", type=int, default=4096)
    eng.add_argument("--no-enforce-eager", dest="enforce_eager", action="store_false",
                     help="allow CUDA graphs (eager is the default)")
    eng.add_argument("--batch-invariant", action="store_true", help="set VLLM_BATCH_INVARIANT=1")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--limit", type=int, default=None, help="run only the first N cases")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--cache-budget", type=parse_bytes, default="2GiB", help="segment cache capacity (default 2GiB)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (recorded in the manifest)")
    p.add_argument("--resume", action="store_true",
                   help="resume an interrupted run (the default behaviour; kept for clarity)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from kvaudit.core.arms import parse_arms
    from kvaudit.core.records import read_dataset
    from kvaudit.runners.runner import RunConfig, check_resumable, execute
    from kvaudit.runners.session import open_backend, print_run_summary

    arms = parse_arms(args.arms, args.backend)
    dataset = read_dataset(args.dataset)
    # Refuse a mismatched run directory before spending time on loading the model.
    check_resumable(args.out, {"dataset_hash": dataset.card.content_hash, "arms": arms, "model": args.model})
    if args.backend == "vllm":
        from kvaudit.runners.vllm_backend import open_vllm_backend  # refuses clearly without vLLM

        backend = open_vllm_backend(
            args.model, dtype=args.dtype, max_new_tokens=args.max_new_tokens, cache_bytes=args.cache_budget,
            max_model_len=args.max_model_len, enforce_eager=args.enforce_eager,
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size, batch_invariant=args.batch_invariant)
    else:
        backend = open_backend(args.model, dtype=args.dtype, device=args.device, threads=args.threads,
                               max_new_tokens=args.max_new_tokens, cache_bytes=args.cache_budget)
    cfg = RunConfig(dataset=dataset, out=args.out, arms=arms, model_name=args.model, limit=args.limit)
    manifest = execute(cfg, backend, progress=not args.no_progress)
    print_run_summary(args.out, manifest)
    return 0
