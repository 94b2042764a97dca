"""`kvaudit run`: every case of a dataset under every chosen arm, resumable.

Rerunning the same command resumes: finished cases are skipped (see :mod:`kvaudit.runners.runner`).
The backend and its own options come from :mod:`kvaudit.runners.registry`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvaudit.core.arg_types import byte_size, positive_int
from kvaudit.core.arms import ARMS, DEFAULT_ARMS
from kvaudit.runners.registry import add_backend_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, type=Path, help="dataset directory (segments.jsonl, cases.jsonl)")
    p.add_argument("--out", required=True, type=Path, help="run directory (rerun the same command to resume)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help=f"comma-separated arms from: {', '.join(ARMS)}, and the repairs blend@R (R in [0, 1]) "
                        "and epic@K (K >= 0 tokens; docs/repairs.md) (default: %(default)s)")
    p.add_argument("--model", default="smollm2", help="'smollm2' (default) or a local checkpoint directory")
    add_backend_arguments(p)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--limit", type=positive_int, default=None, help="run only the first N cases")
    p.add_argument("--max-new-tokens", type=positive_int, default=24)
    p.add_argument("--cache-budget", type=byte_size, default="2GiB",
                   help="segment cache capacity, e.g. 500MB or 2GiB (default 2GiB)")
    p.add_argument("--skip-unfit-cases", action="store_true",
                   help="leave out the cases whose prompt cannot fit the model even with one document, "
                        "instead of refusing the run (they are named, recorded in the manifest as "
                        "dataset.unfit_cases and counted missing by the gate)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from kvaudit.core.attestation import attestation_key
    from kvaudit.core.dataset_format import read_dataset
    from kvaudit.core.jsonio import check_writable_dir
    from kvaudit.core.run_dir import RunDir
    from kvaudit.runners.registry import arms_for, backend_options, open_from_args
    from kvaudit.runners.run_summary import print_run_summary
    from kvaudit.runners.runner import RunConfig, check_resumable, execute

    backend_options(args)  # refuse another backend's options before any work
    arms = arms_for(args.arms, args.backend)
    dataset = read_dataset(args.dataset)
    check_writable_dir(args.out)
    attestation_key()  # a key too short to sign with is refused now, not after the run
    # The run directory is locked and checked before time is spent on loading the model.
    with RunDir(args.out).lock("run", create=True):
        check_resumable(args.out, {"dataset_hash": dataset.card.content_hash, "arms": arms, "model": args.model})
        backend = open_from_args(args, dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                                 cache_bytes=args.cache_budget)
        cfg = RunConfig(dataset=dataset, out=args.out, arms=arms, model_name=args.model, limit=args.limit,
                        skip_unfit=args.skip_unfit_cases)
        manifest = execute(cfg, backend, progress=not args.no_progress)
        print_run_summary(args.out, manifest)
    return 0
