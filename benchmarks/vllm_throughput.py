"""Throughput of the audit itself on vLLM: cases one at a time vs ``--concurrent`` at a time, side by side.

One engine, one dataset, the arms recompute, reuse, identity and recompute_again. First the first
``--sequential`` cases run one case at a time (the default), then, after the segment store is
emptied, all ``--cases`` run ``--concurrent`` cases at a time (``kvaudit run --concurrent-cases``:
each arm's requests for the group in one engine batch). Both are real ``kvaudit`` runs (the
runner, the manifest, resumable run directories) and both are audited. Printed: seconds per case
in each mode and their ratio, the whole concurrent run's wall time against the target, and each
run's noise floor and identity control (every arm of a case meets the same batch conditions, so
``recompute_again`` measures the noise of the batching it ran under).

After the run, the same cases' full prompts are sent to the same engine all at once with one new
token, then with the answer length (:func:`prefill_floor`): issue 28's floor is three full
prefills per case, and the concurrent run's wall is printed over it.

Issue 13's target (500 cases x 4 arms of the Llama-3.1-8B shape at about 8K tokens in under 10
minutes on one H200), after the shared/gpu install runs:
    python3 benchmarks/vllm_throughput.py --model /tmp/l8b --make-shape llama3-8b --cases 500 \\
        --concurrent 16 --sequential 16 --json $OUT/throughput.json
Here, on the CPU build (SmolLM2, short prompts):
    .venv-vllm/bin/python benchmarks/vllm_throughput.py --cases 12 --concurrent 4 --sequential 4 \\
        --docs 3 --words 60,80 --max-model-len 4096
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kvaudit.audit.audit_cli import audit
from kvaudit.cli import main as kvaudit_main
from kvaudit.core.dataset_format import read_dataset
from kvaudit.core.run_format import read_pairs
from kvaudit.runners.engines.vllm.backend import open_vllm_backend
from kvaudit.runners.registry import arms_for
from kvaudit.runners.runner import RunConfig, execute

ARMS = "recompute,reuse,identity,recompute_again"
TARGET_S = 600.0


def make_shape(folder: Path, shape: str) -> None:
    """The shape folder of benchmarks/vllm_ttft.py (one definition of the 8B shape)."""
    spec = importlib.util.spec_from_file_location("vllm_ttft", Path(__file__).with_name("vllm_ttft.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make_shape(folder, shape)


def empty_store(backend: Any) -> None:
    """Forget every segment and head entry, so each mode starts with a cold segment store."""
    held = list(backend.store_rpc("info"))
    if held:
        backend.store_rpc("drop", held)
    backend.cache.entries.clear()
    backend.sync_store()


def one_mode(backend: Any, dataset: Any, out: Path, concurrent: int, limit: int | None) -> dict[str, Any]:
    backend.concurrent_cases, backend.max_in_flight = concurrent, 0
    empty_store(backend)
    m = execute(RunConfig(dataset=dataset, out=out, arms=arms_for(ARMS, "vllm"), model_name="bench",
                          limit=limit), backend, progress=False)
    pairs = read_pairs(out)
    result = audit(out)
    walls = [s.wall_s or 0.0 for s in m.sessions]

    def control(arm: str) -> tuple[float, int]:
        diffs = [p.arms[arm].logit_diff_vs_recompute or 0.0 for p in pairs]
        flips = sum(p.arms[arm].answer_ids != p.arms["recompute"].answer_ids for p in pairs)
        return max(diffs), flips

    floor, floor_flips = control("recompute_again")
    ident, ident_flips = control("identity")
    return {"concurrent_cases": concurrent, "cases": len(pairs), "wall_s": sum(walls),
            "s_per_case": sum(walls) / max(1, len(pairs)), "timing_s": m.timing_s,
            "max_in_flight": m.backend["batching"]["max_requests_in_flight"],
            "audit_passed": bool(result["passed"]),
            "failed_checks": [c["name"] for c in result["checks"] if c["required"] and not c["passed"]],
            "noise_floor_max": floor, "noise_floor_flips": floor_flips,
            "identity_max": ident, "identity_flips": ident_flips,
            "answers": {p.case_id: {a: r.answer_ids for a, r in p.arms.items()} for p in pairs}}


def prefill_floor(backend: Any, dataset: Any, n: int) -> dict[str, float]:
    """Issue 28's floor for the same cases, measured on the same engine right after the run: every
    case's full prompt (assembled as the runner assembles it) submitted at once with a fresh cache
    salt, once with one new token (prefill only) and once with the run's answer length; the engine
    schedules them at its own batch limits. The audit's floor is three full prefills per case
    (recompute, recompute_again, identity's capture)."""
    from kvaudit.runners.prompt import assemble

    ids = [assemble(c, dataset.segments, backend.tok, backend.max_prompt_tokens).ids for c in dataset.cases[:n]]
    out = {}
    for name, new in (("prefill_s", 1), ("prefill_answer_s", backend.decoding.max_new_tokens)):
        t0 = time.perf_counter()
        backend._batch([(x, backend._params(max_tokens=new), None) for x in ids])
        out[name] = time.perf_counter() - t0
    out["tokens"] = float(sum(len(x) for x in ids))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="smollm2, or a config folder served with load_format=dummy")
    ap.add_argument("--make-shape", default=None, metavar="SHAPE", help="write SHAPE's config into --model first")
    ap.add_argument("--dtype", default=None, help="default bfloat16 for a config folder, float32 for smollm2")
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--concurrent", type=int, default=16, help="cases at a time in the concurrent mode")
    ap.add_argument("--sequential", type=int, default=16, help="cases run one at a time for the comparison (at least 1)")
    ap.add_argument("--docs", type=int, default=8, help="documents per case")
    ap.add_argument("--words", default="700,800", help="document length in words, MIN,MAX (8 x 750: about 8K tokens)")
    ap.add_argument("--max-model-len", type=int, default=9216)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--kv-cache-gib", type=float, default=24.0)
    ap.add_argument("--store-gib", type=float, default=40.0)
    ap.add_argument("--no-enforce-eager", action="store_true", help="CUDA graphs (and torch.compile)")
    ap.add_argument("--work", default=None, help="folder for the dataset and run directories (default: a temporary one)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.sequential < 1 or args.concurrent < 1 or args.cases < args.sequential:
        raise SystemExit("--sequential and --concurrent must be at least 1, and --cases at least --sequential")
    dummy = args.model != "smollm2"
    if args.make_shape:
        make_shape(Path(args.model), args.make_shape)
    dtype = args.dtype or ("bfloat16" if dummy else "float32")
    lo, hi = args.words.split(",")
    work = Path(args.work or tempfile.mkdtemp(prefix="kvaudit-throughput-"))
    ds_dir = work / "dataset"
    if not (ds_dir / "dataset.json").exists():
        kvaudit_main(["generate", "boxoffice", "--out", str(ds_dir), "--cases", str(args.cases), "--seed", "0",
                      "--min-docs", str(args.docs), "--max-docs", str(args.docs), "--min-words", lo, "--max-words", hi,
                      "--families", "single_doc=2,multi_hop_bridge=1,multi_hop_compare=1", "--no-progress"])
    dataset = read_dataset(ds_dir)
    t0 = time.perf_counter()
    opts: dict[str, Any] = {"load_format": "dummy"} if dummy else {}
    backend = open_vllm_backend(args.model, dtype=dtype, max_new_tokens=args.max_new_tokens,
                                cache_bytes=int(args.store_gib * (1 << 30)), max_model_len=args.max_model_len,
                                kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
                                enforce_eager=not args.no_enforce_eager, **opts)
    start_s = time.perf_counter() - t0
    info = backend.info()
    print(f"vLLM {info['vllm']} on {info['device']}, {dtype}, {'eager' if not args.no_enforce_eager else 'graphs'}; "
          f"engine start {start_s:.0f} s; {len(dataset.cases)} cases, median prompt "
          f"{sorted(len(c.segment_ids) for c in dataset.cases)[len(dataset.cases) // 2]} documents")
    seq = one_mode(backend, dataset, work / "seq", 1, args.sequential)
    conc = one_mode(backend, dataset, work / f"conc{args.concurrent}", args.concurrent, args.cases)
    floor = prefill_floor(backend, dataset, conc["cases"])
    backend.close()
    same = {a: sum(conc["answers"][cid][a] == ans[a] for cid, ans in seq["answers"].items()) for a in ARMS.split(",")}
    print(f"\n{'mode':<22} {'cases':>6} {'wall s':>8} {'s/case':>7} {'in flight':>9} {'audit':>6} "
          f"{'floor max/flips':>16} {'identity max/flips':>19}")
    for r in (seq, conc):
        print(f"{'1 case at a time' if r['concurrent_cases'] == 1 else str(r['concurrent_cases']) + ' cases at a time':<22} "
              f"{r['cases']:>6} {r['wall_s']:>8.1f} {r['s_per_case']:>7.3f} {r['max_in_flight']:>9} "
              f"{'PASS' if r['audit_passed'] else 'FAIL':>6} {r['noise_floor_max']:>9.2e} / {r['noise_floor_flips']:<4}"
              f"{r['identity_max']:>11.2e} / {r['identity_flips']:<4}")
        if r["failed_checks"]:
            print(f"    failed: {', '.join(r['failed_checks'])}")
    speed = seq["s_per_case"] / conc["s_per_case"] if conc["s_per_case"] else float("nan")
    target = ""
    if dummy and conc["cases"] >= 500:  # issue 13's target is for 500 cases of the 8B shape on one H200
        target = f" (target {TARGET_S:.0f} s: {'met' if conc['wall_s'] < TARGET_S else 'MISSED'})"
    print(f"\nconcurrent vs one at a time: {speed:.2f}x per case; {conc['cases']} cases x 4 arms in "
          f"{conc['wall_s']:.0f} s{target}; one at a time would take about {seq['s_per_case'] * conc['cases']:.0f} s")
    three = 3 * floor["prefill_s"]
    print(f"prefill floor: {conc['cases']} full prompts ({floor['tokens'] / conc['cases']:.0f} tokens each) at once "
          f"{floor['prefill_s']:.1f} s ({floor['tokens'] / floor['prefill_s']:.0f} tokens/s), with the answers "
          f"{floor['prefill_answer_s']:.1f} s; three per case {three:.1f} s: the audit's wall is "
          f"{conc['wall_s'] / three:.2f}x that (target 1.2x), {conc['wall_s'] / (3 * floor['prefill_answer_s']):.2f}x "
          "three prefills with their answers")
    print("answers equal between the two batchings on the first "
          f"{len(seq['answers'])} cases: " + ", ".join(f"{a} {n}/{len(seq['answers'])}" for a, n in same.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"engine_start_s": start_s, "info": info, "sequential": seq,
                                               "concurrent": conc, "speedup": speed, "same_answers": same,
                                               "floor": floor},
                                              indent=1, default=str))


if __name__ == "__main__":
    main()
