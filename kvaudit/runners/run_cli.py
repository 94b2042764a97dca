"""`kvaudit run`: every case of a dataset under every chosen arm, resumable.

Rerunning the same command resumes: finished cases are skipped (see :mod:`kvaudit.runners.runner`).
The backend and its own options come from :mod:`kvaudit.runners.registry`; with ``--engines FILE``
the run is a serving-change run, its baseline and candidate engines read from the file
(:mod:`kvaudit.runners.engines_file`, :mod:`kvaudit.runners.serving_change`), and the single-engine
flags (``--backend``, ``--model``, ``--dtype``, ``--max-new-tokens`` and the backends' options) are
refused beside it: they are the shorthand for a baseline alone.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvaudit.core.arg_types import byte_size, positive_int
from kvaudit.core.arms import ARMS, DEFAULT_ARMS, SERVING_CHANGE_ARMS, SERVING_CHANGE_DEFAULT_ARMS
from kvaudit.core.errors import KvauditError
from kvaudit.runners.registry import DEFAULT_BACKEND, add_backend_arguments

if TYPE_CHECKING:
    from kvaudit.core.run_dir import RunDir
    from kvaudit.runners.backend import Backend

DEFAULT_MODEL = "smollm2"
_SINGLE_ENGINE = {"backend": "--backend", "model": "--model", "dtype": "--dtype", "max_new_tokens": "--max-new-tokens"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, type=Path, help="dataset directory (segments.jsonl, cases.jsonl)")
    p.add_argument("--out", required=True, type=Path, help="run directory (rerun the same command to resume)")
    p.add_argument("--arms", default=None,
                   help=f"comma-separated arms from: {', '.join(ARMS)}, and the repairs blend@R (R in [0, 1]) "
                        f"and epic@K (K >= 0 tokens; docs/repairs.md) (default: {','.join(DEFAULT_ARMS)}; with "
                        f"--engines {','.join(SERVING_CHANGE_DEFAULT_ARMS)})")
    p.add_argument("--engines", type=Path, default=None, metavar="FILE",
                   help="a serving-change run: engines.toml with a [baseline] and a [candidate] engine "
                        "(docs/serving-changes.md); replaces --backend, --model, --dtype and --max-new-tokens")
    p.add_argument("--model", default=None, help=f"'{DEFAULT_MODEL}' (default) or a local checkpoint directory")
    add_backend_arguments(p, default=None)
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default float32")
    p.add_argument("--limit", type=positive_int, default=None, help="run only the first N cases")
    p.add_argument("--max-new-tokens", type=positive_int, default=None, help="default 24")
    p.add_argument("--cache-budget", type=byte_size, default="2GiB",
                   help="segment cache capacity, e.g. 500MB or 2GiB (default 2GiB)")
    p.add_argument("--skip-unfit-cases", action="store_true",
                   help="leave out the cases whose prompt cannot fit the model even with one document, "
                        "instead of refusing the run (they are named, recorded in the manifest as "
                        "dataset.unfit_cases and counted missing by the gate)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def prepare(args: argparse.Namespace) -> tuple[list[str], Any]:
    """Check the engine flags and return the run's arms and its engines file (``None``: one engine),
    before any work: a single-engine flag beside ``--engines`` is refused, as is a serving-change
    arm without it; the defaults of the single-engine flags are filled in."""
    from kvaudit.runners.engines_file import read_engines
    from kvaudit.runners.registry import arms_for, backend_options, engine_flags_given

    if args.engines is not None:
        given = engine_flags_given(args, _SINGLE_ENGINE)
        if given:
            raise KvauditError(f"{given[0]} and --engines: with --engines every engine setting comes from "
                               f"{args.engines} (its [baseline] and [candidate] tables)")
        engines = read_engines(args.engines)
        args.backend, args.model = engines.baseline.backend, engines.baseline.model
        args.dtype, args.max_new_tokens = engines.baseline.dtype, engines.baseline.max_new_tokens
        arms = arms_for(args.arms or ",".join(SERVING_CHANGE_DEFAULT_ARMS), args.backend)
        if not any(a in SERVING_CHANGE_ARMS for a in arms):
            raise KvauditError(f"--engines {args.engines}: --arms names no arm of the candidate engine "
                               f"({', '.join(SERVING_CHANGE_ARMS)}): nothing would compare the two engines")
        return arms, engines
    args.backend = args.backend or DEFAULT_BACKEND
    args.model = args.model or DEFAULT_MODEL
    args.dtype = args.dtype or "float32"
    args.max_new_tokens = args.max_new_tokens or 24
    backend_options(args)  # refuse another backend's options before any work
    arms = arms_for(args.arms or ",".join(DEFAULT_ARMS), args.backend)
    serving = [a for a in arms if a in SERVING_CHANGE_ARMS]
    if serving:
        raise KvauditError(f"--arms: arm {serving[0]!r} runs on a candidate engine: give --engines engines.toml "
                           "(docs/serving-changes.md)")
    return arms, None


def cheap_identity(dataset: Any, arms: list[str], model: str, engines: Any) -> dict[str, Any]:
    """The identity keys a resumed run is checked against before any engine starts (an engines
    file that changed is refused in a second, not after the engines' start)."""
    ident = {"dataset_hash": dataset.card.content_hash, "arms": arms, "model": model}
    if engines is not None:
        ident["engines_sha256"] = engines.sha256()
    return ident


def open_backend(args: argparse.Namespace, arms: list[str], engines: Any) -> Any:
    """The run's backend: the one the flags name, or the engines file's engines behind one."""
    from kvaudit.runners.registry import open_from_args

    if engines is not None:
        from kvaudit.runners.serving_change import open_engines

        return open_engines(engines, arms, args.cache_budget)
    return open_from_args(args, dtype=args.dtype, max_new_tokens=args.max_new_tokens, cache_bytes=args.cache_budget)


def prepare_out(out: Path) -> None:
    """Before a command writes ``out`` (a run or a replay): it is a directory this user may write,
    or may create, and vLLM's lines go to ``out/engine.log``, not the terminal."""
    from kvaudit.core.jsonio import check_writable_dir
    from kvaudit.runners.engines.vllm.engine_log import log_beside

    check_writable_dir(out)
    log_beside(out)


@contextlib.contextmanager
def locked_run(out: Path) -> Iterator[RunDir]:
    """The run directory, prepared (:func:`prepare_out`), the attestation key checked (a key too
    short to sign with is refused now, not after the run) and locked for this process alone."""
    from kvaudit.core.attestation import attestation_key
    from kvaudit.core.run_dir import RunDir

    prepare_out(out)
    attestation_key()
    run = RunDir(out)
    with run.lock("run", create=True):
        yield run


@contextlib.contextmanager
def run_backend(args: argparse.Namespace, dataset: Any, arms: list[str], engines: Any) -> Iterator[Backend]:
    """The run's backend, opened once the directory is known to resume this run (checked before
    time is spent loading the model), closed when the run is done or fails."""
    from kvaudit.runners.runner import check_resumable

    check_resumable(args.out, cheap_identity(dataset, arms, args.model, engines))
    backend = open_backend(args, arms, engines)
    try:
        yield backend
    finally:
        backend.close()


def run(args: argparse.Namespace) -> int:
    from kvaudit.core.dataset_format import read_dataset
    from kvaudit.runners.run_summary import print_run_summary
    from kvaudit.runners.runner import RunConfig, execute

    arms, engines = prepare(args)
    dataset = read_dataset(args.dataset)
    with locked_run(args.out), run_backend(args, dataset, arms, engines) as backend:
        cfg = RunConfig(dataset=dataset, out=args.out, arms=arms, model_name=args.model, limit=args.limit,
                        skip_unfit=args.skip_unfit_cases)
        manifest = execute(cfg, backend, progress=not args.no_progress)
        print_run_summary(args.out, manifest)
    return 0
