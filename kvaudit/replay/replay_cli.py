"""``kvaudit replay``: serve a workload through a backend under one cache policy and a KV budget.

    kvaudit replay --workload W.jsonl --cache-policy segment --cache-budget 200MB --out runs/replay-segment

Writes ``replay_config.json``, ``requests.jsonl`` (one record per request, resumable: rerun the
same command after a kill) and ``replay.json`` (:mod:`kvaudit.replay.summary`), and prints the
TTFT percentiles and the measured hit rate beside the simulator's. docs/replay.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvaudit.core.arg_types import byte_size, positive_int, positive_number
from kvaudit.core.errors import KvauditError, excerpt
from kvaudit.core.replay_format import POLICIES
from kvaudit.runners.engines_file import ROLES
from kvaudit.runners.registry import add_backend_arguments

if TYPE_CHECKING:
    from kvaudit.runners.backend import Backend

# Open-loop replays on these send each request at its arrival (the default there): the in-process vLLM
# engine stepped by kvaudit, or a server, sent each request on its own connection.
ARRIVALS_BACKENDS = ("vllm", "openai")
# The most requests in flight under the arrivals schedule unless --concurrency says: vLLM's
# max_num_seqs in process; over HTTP, enough that the client never holds back a server's load.
ARRIVALS_CONCURRENCY = {"vllm": 8, "openai": 256}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True, type=Path, help="workload JSONL (kvaudit generate workload)")
    p.add_argument("--cache-policy", "--policy", dest="cache_policy", required=True, choices=POLICIES,
                   help="recompute (nothing cached), prefix (the engine's own prefix cache; --backend vllm) "
                        "or segment (kvaudit's segment store with neutral warm-ups). --policy is its old name, "
                        "still accepted (elsewhere --policy is the gate's policy file)")
    p.add_argument("--cache-budget", "--budget", dest="cache_budget", required=True, type=byte_size,
                   help="KV bytes the policy may keep cached between requests, e.g. 200MB or 2GiB (the name "
                        "`kvaudit run` and `kvaudit simulate` use; --budget is its old name, still accepted)")
    p.add_argument("--out", required=True, type=Path, help="replay directory (rerun the same command to resume)")
    p.add_argument("--concurrency", type=positive_int, default=None,
                   help="waves: the most requests served together in one wave (default 1); arrivals: the most "
                        "requests the engine runs at once, vLLM's max_num_seqs (default 8; later arrivals wait for "
                        "a slot holding nothing, as in a server's queue), or on a server the most in flight "
                        "from kvaudit (default 256; a later arrival waits on the client, its wait in its TTFT)")
    p.add_argument("--schedule", choices=("arrivals", "waves"), default=None,
                   help="arrivals: each request joins the engine's running batch when it arrives (open loop on "
                        "--backend vllm or openai, the default there); waves: requests go in waves, arrivals during a wave "
                        "wait for the next (the default elsewhere; for comparison)")
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--rate", type=rates, default=None, metavar="R[,R...]",
                      help="open loop: Poisson arrivals at R requests per second (seeded by --seed); several "
                           "rates sweep the load on one engine, each into OUT/rate-R with empty caches, and "
                           "OUT/sweep.json holds TTFT against offered load")
    loop.add_argument("--timestamps", action="store_true",
                      help="open loop: arrivals at the workload's own timestamps (relative to the first request)")
    p.add_argument("--seed", type=int, default=0, help="seed of --rate's arrivals (default 0)")
    p.add_argument("--replications", type=positive_int, default=1, metavar="K",
                   help="with --rate: serve each load K times, with arrival seeds SEED..SEED+K-1, each into "
                        "OUT/rate-R-seed-S with empty caches; each load's TTFT percentiles are then the median "
                        "over its replications with a 95%% interval that holds under queueing (both ends from 6 "
                        "replications; one replay's own intervals do not: docs/replay.md)")
    p.add_argument("--kv-space", type=byte_size, default=None, metavar="BYTES",
                   help="--backend vllm: the engine's KV space for the requests in flight, as your server has it "
                        "(e.g. 6GB; prefix caching's --cache-budget is added on top). A request that does not fit "
                        "beside the others waits or is preempted, as on the server, and the records count its "
                        "preemptions. Default: --concurrency of the longest request, so none waits for space")
    p.add_argument("--engines", type=Path, default=None, metavar="FILE",
                   help="a serving change under load: replay on one table of an engines file (docs/serving-changes.md), "
                        "its backend, model, dtype and options in place of --backend, --model, --dtype and the "
                        "backend's flags; replay --engine baseline and --engine candidate into two --out "
                        "directories and set them side by side with kvaudit compare")
    p.add_argument("--engine", choices=ROLES, default=None, help="with --engines: the table to replay on")
    p.add_argument("--model", default=None, help="'smollm2' (default) or a local checkpoint directory")
    add_backend_arguments(p, default=None)
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default float32")
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


def _arrivals(args: argparse.Namespace, requests: list[Any], rate: float | None,
              seed: int) -> tuple[str, list[float] | None]:
    """The arrival spec recorded in the replay's config, and one arrival time per workload request
    (seconds from the first), or None for the closed loop."""
    from kvaudit.core.replay_format import poisson_spec
    from kvaudit.replay.serve import poisson_arrivals

    if rate is not None:
        return poisson_spec(rate, seed), poisson_arrivals(len(requests), rate, seed)
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


def rates(text: str) -> list[float]:
    """argparse type of ``--rate``: one or more positive, finite requests per second, comma-separated."""
    out = [positive_number(t.strip(), "requests per second") for t in text.split(",")]
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"a rate is given twice in {text!r}")
    return out


def _schedule(args: argparse.Namespace) -> str:
    """``arrivals`` or ``waves``: what was asked, else arrivals for an open loop on in-process vLLM."""
    open_loop = args.rate is not None or args.timestamps
    if args.schedule is None:
        return "arrivals" if open_loop and args.backend in ARRIVALS_BACKENDS else "waves"
    if args.schedule == "arrivals":
        if args.backend not in ARRIVALS_BACKENDS:
            raise KvauditError(f"--schedule arrivals needs an engine that batches requests as they come: --backend "
                               f"vllm (in process, stepped by kvaudit) or openai (a server), not {args.backend}")
        if not open_loop:
            raise KvauditError("--schedule arrivals needs arrival times: --rate R or --timestamps")
    return str(args.schedule)


def _engine_facts(backend: Backend, dtype: str, model: str) -> dict[str, Any]:
    from kvaudit.models import resolve_model_dir
    from kvaudit.replay.serve import stored_bytes_per_token
    from kvaudit.simulator.kv_bytes import resolve_model

    info = backend.info()
    engine = info.get("engine") or {}
    bpt = backend.bytes_per_token()
    if bpt is None:  # the engine does not say: the model's shape at its KV cache's dtype
        bpt = stored_bytes_per_token(resolve_model(str(resolve_model_dir(model)), dtype).bytes_per_token, dtype,
                                     engine.get("kv_cache_dtype"))
    return {
        "backend": info["backend"],
        "device": info.get("device", "cpu"),
        "dtype": info["dtype"],
        "block_size": int(engine.get("block_size", 16)),
        "bytes_per_token": int(bpt),
        "kv_tokens": backend.kv_cache_tokens(),
        "stores_heads": bool(backend.stores_heads),
        "heads_saved_after_load": bool(backend.heads_saved_after_load),
        "max_prompt_tokens": int(backend.max_prompt_tokens),
    }


def _ms(v: dict[str, Any], ends: int = 1, width: int = 0) -> str:
    """A percentile and its interval in milliseconds ("?" for an end the sample cannot bound)."""
    lo = "?" if v["low"] is None else f"{1e3 * v['low']:.{ends}f}"
    hi = "?" if v["high"] is None else f"{1e3 * v['high']:.{ends}f}"
    return f"{1e3 * v['value']:>{width}.1f} ms [{lo}, {hi}]"


def _print_summary(s: dict[str, Any], out: Path) -> None:
    from kvaudit.replay.summary import UNCLAIMED_INTERVALS

    t = s["ttft_s"]
    hr = s["hit_rate"]
    c = s["config"]
    if s.get("truncated_requests"):
        print(f"warning: {s['truncated_requests']:,} of this replay's requests were served with trailing documents "
              "dropped (a replay before 2026-12-05): its numbers describe shorter prompts than the workload's",
              file=sys.stderr)
    pre = s.get("preemptions")
    if pre and pre["requests"]:
        print(f"warning: vLLM preempted {pre['requests']:,} of this replay's requests ({pre['total']:,} times): its KV "
              "space ran out mid-batch, so their TTFT includes recomputing or reloading what they lost; "
              + (f"the engine ran at --kv-space {c['kv_space_bytes']:,} B, as you gave it (docs/replay.md)"
                 if c.get("kv_space_bytes") else "a replay's engine is sized so that this does not happen "
                 "(docs/replay.md)"), file=sys.stderr)
    how = ("each request joining the running batch at its arrival" if c.get("schedule") == "arrivals"
           else f"in waves of up to {c['concurrency']}")
    space = f", KV space {c['kv_space_bytes']:,} B for requests in flight" if c.get("kv_space_bytes") else ""
    if c.get("engine_role"):
        space += f", on the {c['engine_role']} engine" + (f" ({c['engine_change']})" if c.get("engine_change") else "")
    print(f"\nreplay {c['policy']} at budget {c['budget_bytes']:,} B{space}: {s['requests']} requests "
          f"({s['sessions']} session(s)), {how}, arrivals {c.get('arrivals', 'closed')}, in {out}")
    print(f"  TTFT p50 {_ms(t['p50'])}  p95 {_ms(t['p95'])}  p99 {_ms(t['p99'])}")
    if not s.get("ttft_intervals_claimed", True):
        print(f"  ({UNCLAIMED_INTERVALS})")
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
        for part, what in (("before_engine", "before vLLM stamped the arrival"),
                           ("after_engine", "after vLLM stamped the first token")):
            if co.get(part):
                print(f"    {what}: median {1e3 * co[part]['p50']:.2f} ms, p95 {1e3 * co[part]['p95']:.2f} ms")
    if hr.get("overflow_tokens"):
        print(f"  {hr['overflow_tokens']:,} head and document tokens the store could not hold while other requests "
              "were in flight: prefilled, counted as misses")
    tp = s.get("time_per_output_token_s")
    if tp:
        print(f"  time per output token p50 {_ms(tp['p50'])}  p95 {_ms(tp['p95'])}")
    th = s["throughput"]
    if th["requests_per_s"]:
        print(f"  throughput {th['requests_per_s']:.2f} requests/s, {th['prompt_tokens_per_s']:,.0f} prompt tokens/s")


def run(args: argparse.Namespace) -> int:
    from kvaudit.replay.serve import POLICY_ARM
    from kvaudit.replay.workload_text import read_workload
    from kvaudit.runners.registry import check_arms_run_on
    from kvaudit.runners.run_cli import prepare_out

    opts, engine_table = engine_options(args)  # refuse another backend's options before any work
    schedule = _schedule(args)
    table_seqs = opts.pop("max_num_seqs", None) if engine_table else None
    if table_seqs is not None and args.concurrency not in (None, table_seqs):
        raise KvauditError(f"--concurrency {args.concurrency} and {args.engines}: [{args.engine}] sets max_num_seqs = "
                           f"{table_seqs}, the most requests its engine runs at once; give one of them")
    if args.concurrency is None:
        args.concurrency = table_seqs or (ARRIVALS_CONCURRENCY[args.backend] if schedule == "arrivals" else 1)
    check_arms_run_on([POLICY_ARM[args.cache_policy]], args.backend)
    if args.kv_space is not None and args.backend != "vllm":
        raise KvauditError(f"--kv-space sizes the KV space of the in-process vLLM engine (--backend vllm); on "
                           f"--backend {args.backend} the engine sizes its own (a vLLM server's "
                           "--kv-cache-memory-bytes or --gpu-memory-utilization, set when it starts)")
    if args.cache_policy == "prefix" and args.backend != "vllm":
        raise KvauditError("--cache-policy prefix holds the engine's own prefix cache to --cache-budget; that needs "
                           "--backend vllm (in process)")
    if args.cache_policy == "segment" and args.backend not in ("transformers", "vllm"):
        # Over HTTP, a stock server's "reuse" is its own prefix cache primed by warm-ups (measured here:
        # 12% hit where the segment store would hold 42%), and a connector server's store budget is
        # set when the server starts, out of the replay's reach: neither is the segment policy at --cache-budget.
        raise KvauditError(f"--cache-policy segment needs kvaudit's own segment store under --cache-budget: --backend vllm "
                           f"or transformers (in process), not {args.backend}")
    rates = args.rate or [None]
    if args.replications > 1 and args.rate is None:
        raise KvauditError("--replications draws new Poisson arrivals for each replication: it needs --rate")
    seeds = [args.seed + k for k in range(args.replications)]
    sweep = len(rates) * len(seeds) > 1
    if sweep and not (args.backend == "vllm" or (args.backend == "openai" and args.cache_policy == "recompute")):
        raise KvauditError("a sweep of --rate values (or --replications) serves every replay on one engine with "
                           "empty caches: it needs "
                           "--backend vllm, or --backend openai with --cache-policy recompute (nothing cached)")
    if "concurrent_cases" in opts:
        opts["concurrent_cases"] = args.concurrency
    if schedule == "arrivals" and args.backend == "vllm":
        opts["max_num_seqs"] = args.concurrency
    if args.backend == "vllm":
        opts["disable_log_stats"] = False  # vLLM's per-request stats: its own TTFT beside the client's
    prepare_out(args.out)
    requests = read_workload(args.workload)
    if args.limit:
        requests = requests[: args.limit]
    engine = _Engine(args, opts, requests, engine_table)
    loads: list[tuple[float, list[tuple[int, str, dict[str, Any]]]]] = []
    try:
        for rate in rates:
            done = []
            for seed in seeds:
                name = "" if not sweep else f"rate-{rate:g}" + (f"-seed-{seed}" if len(seeds) > 1 else "")
                out = args.out / name if sweep else args.out
                done.append((seed, name, _replay_one(args, schedule, rate, seed, out, requests, engine)))
            loads.append((rate, done))  # type: ignore[arg-type]  # a sweep's rates are numbers
    finally:
        engine.close()
    if sweep:
        _print_sweep(args.out, write_sweep(args.out, loads))
    if args.audit_sample and engine.backend is not None:  # written by the session that served the requests
        write_audit_sample(requests, args.audit_sample, args.audit_dataset or Path(args.out) / "audit_dataset",
                           engine.synth, args)
    return 0


_SINGLE_ENGINE = {"backend": "--backend", "model": "--model", "dtype": "--dtype"}


def engine_options(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The backend options a replay opens its engine with, and, with ``--engines``, what the replay
    records of the table it replays on (role, change, digest); ``args.backend``, ``model`` and
    ``dtype`` filled in from the flags' defaults or the table. The table's KV space (``kv_cache_bytes``
    or vLLM's ``kv_cache_memory_bytes``) is the replay's ``--kv-space``, never overridden by the
    replay's own sizing: a change of KV space is what that serving change is."""
    from kvaudit.runners.engines_file import read_engines
    from kvaudit.runners.registry import BACKENDS, backend_options, engine_flags_given
    from kvaudit.runners.serving_change import KV_SPACE_NAMES

    if args.engines is None:
        if args.engine is not None:
            raise KvauditError("--engine names a table of an engines file: give it with --engines FILE")
        args.backend = args.backend or "transformers"
        args.model = args.model or "smollm2"
        args.dtype = args.dtype or "float32"
        return backend_options(args), None
    given = engine_flags_given(args, _SINGLE_ENGINE)
    if given:
        raise KvauditError(f"{given[0]} and --engines: with --engines the engine's settings come from "
                           f"{args.engines} (the table --engine names)")
    if args.engine is None:
        raise KvauditError(f"--engines {args.engines}: give --engine baseline or --engine candidate, the table to "
                           "replay on (each into its own --out, then kvaudit compare sets them side by side)")
    engines = read_engines(args.engines)
    spec = getattr(engines, args.engine)
    args.backend, args.model, args.dtype = spec.backend, spec.model, spec.dtype
    args.table_max_model_len = spec.options.get("max_model_len")
    opts = {**BACKENDS[spec.backend].option_defaults(), **spec.options}
    kv = [k for k in KV_SPACE_NAMES if k in spec.options]
    if len(kv) > 1:
        raise KvauditError(f"{args.engines}: [{args.engine}.options] sets both {kv[0]} and {kv[1]}: one KV space")
    if kv:
        if args.kv_space is not None:
            raise KvauditError(f"--kv-space and {args.engines}: [{args.engine}.options] sets {kv[0]}, the engine's "
                               "KV space; give one of them")
        value = opts.pop(kv[0])
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise KvauditError(f"{args.engines}: [{args.engine}.options] {kv[0]} must be a positive whole number of "
                               f"bytes, got {excerpt(repr(value), 40)}")
        args.kv_space, args.kv_space_named = value, f"{kv[0]} in {args.engines} [{args.engine}.options]"
    if spec.options.get("segment_connector") is False and args.cache_policy == "segment":
        raise KvauditError(f"--cache-policy segment serves documents through kvaudit's KV connector, which "
                           f"{args.engines} [{args.engine}.options] segment_connector = false leaves out")
    table = {"role": args.engine, "change": engines.change if args.engine == "candidate" else None,
             "sha256": spec.sha256()[:16]}
    return opts, table


def given_max_model_len(args: argparse.Namespace) -> tuple[Any, str, str]:
    """The max_model_len the user gave (None where left out), that setting as written, and where to
    raise it."""
    from kvaudit.runners.registry import given_option

    if getattr(args, "engines", None) is not None:
        given = getattr(args, "table_max_model_len", None)
        where = f"max_model_len in {args.engines} [{args.engine}.options]"
        return given, f"max_model_len = {given} in {args.engines} [{args.engine}.options]", where
    given = given_option(args, "--max-model-len")
    return given, f"--max-model-len {given}", "--max-model-len"


class _Engine:
    """The backend, opened at the first load that has requests left to serve (a finished replay
    opens nothing) and kept for the loads after it, each starting with empty caches."""

    def __init__(self, args: argparse.Namespace, opts: dict[str, Any], requests: list[Any],
                 table: dict[str, Any] | None = None):
        self.args, self.opts, self.requests = args, opts, requests
        self.table = table or {}  # the engines file's table it opens, where --engines gives one
        self.backend: Any = None
        self.facts: dict[str, Any] = {}
        self.synth: Any = None
        self.template_len = 0
        self.served = False

    def get(self) -> Any:
        from kvaudit.replay.serve import store_budget
        from kvaudit.runners.registry import BACKENDS

        args = self.args
        if self.backend is not None:
            if self.served:
                self.backend.reset_caches()
            return self.backend
        common: dict[str, Any] = {"dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
                                  "cache_bytes": store_budget(args.cache_policy, args.cache_budget)}
        opts = dict(self.opts)
        if args.backend == "vllm":
            opts.update(self._vllm_sizes(opts))
        self.backend = BACKENDS[args.backend].open(args.model, **common, **opts)
        self.backend.asks_logprobs = False  # a replay reads tokens and times only
        from kvaudit.core.dataset_format import DEFAULT_SYSTEM
        from kvaudit.replay.workload_text import SyntheticText

        self.facts = _engine_facts(self.backend, args.dtype, args.model)
        self.template_len = len(self.backend.tok.head_ids(DEFAULT_SYSTEM, ""))
        texts = all(p.text is not None for r in self.requests for p in r.pieces)
        self.synth = None if texts else SyntheticText(self.backend.tok.tok)
        return self.backend

    def _vllm_sizes(self, opts: dict[str, Any]) -> dict[str, Any]:
        """max_model_len and KV space for in-process vLLM. Without ``--max-model-len`` the engine
        is opened for the workload's longest request whole and its answer (by the workload's token
        counts; up to the model's context), never the option's default, which would make a longer
        request one the replay refuses. The KV space holds ``--concurrency`` such requests in flight
        (the engine runs at most that many, a segment warm-up among them), and for the prefix policy
        the budget on top, so what the engine keeps cached between requests is the budget."""
        from kvaudit.core.jsonio import read_json
        from kvaudit.models import resolve_model_dir
        from kvaudit.replay.serve import replay_kv_bytes, stored_bytes_per_token
        from kvaudit.replay.workload_text import longest_request_tokens
        from kvaudit.simulator.kv_bytes import resolve_model

        args = self.args
        path = resolve_model_dir(args.model)
        bpt = stored_bytes_per_token(resolve_model(str(path), args.dtype).bytes_per_token, args.dtype,
                                     opts.get("kv_cache_dtype"))
        longest = longest_request_tokens(self.requests)
        block = int(opts.get("block_size", 32))
        fit = -(-(longest + args.max_new_tokens) // block) * block
        given, _, _ = given_max_model_len(args)
        if given is None:
            context = read_json(path / "config.json").get("max_position_embeddings")
            max_len = min(fit, int(context)) if isinstance(context, int) else fit
        else:  # the user's, or less where every request fits in less
            max_len = min(int(given), fit)
        least = (-(-max_len // block) + 1) * block * bpt  # vLLM keeps one block of its own (its null block)
        if args.kv_space is not None and args.kv_space < least:
            named = getattr(args, "kv_space_named", "--kv-space")
            raise KvauditError(f"{named}: {args.kv_space:,} B holds {args.kv_space // bpt:,} tokens of this "
                               f"model's KV ({bpt:,} B per token at {args.dtype}); the workload's longest request "
                               f"needs {max_len:,} with its answer, in blocks of {block} beside one block vLLM keeps, "
                               f"and vLLM refuses an engine that cannot hold one. Raise {named} to at least "
                               f"{least:,} B")
        return {"max_model_len": max_len,
                "kv_cache_bytes": replay_kv_bytes(args.cache_policy, args.cache_budget, args.concurrency,
                                                  min(longest, max_len), bpt, block, kv_space=args.kv_space)}

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


def check_requests_fit(args: argparse.Namespace, limit: int, needs: dict[str, int]) -> None:
    """Refuse a replay whose requests (id -> prompt tokens with every document) do not fit the
    engine whole (``limit``: the backend's ``max_prompt_tokens``): a replay serves the workload's
    requests as they are; dropping documents to fit would measure other prompts than the
    workload's, under the workload's name."""

    over = {rid: n for rid, n in needs.items() if n > limit}
    if not over:
        return
    shown = ", ".join(f"{rid} ({n:,} tokens)" for rid, n in list(over.items())[:5])
    more = f" and {len(over) - 5:,} more" if len(over) > 5 else ""
    given, written, where = given_max_model_len(args)
    if args.backend == "vllm" and given is not None:
        why = (f"{written} less {args.max_new_tokens} answer token(s)", f"raise {where}, up to the model's context")
    elif args.backend == "vllm":
        why = ("the engine opened for the workload's longest request by its token counts, up to the model's "
               "context", "if the workload's token counts are another tokenizer's, give --max-model-len; "
               "otherwise the requests are longer than the model's context")
    elif args.backend == "openai":
        why = ("the server's context length less the answer tokens", "serve them from a server started with a "
               "longer context (vLLM's --max-model-len), on a model that has one")
    else:
        why = ("the model's context less the answer tokens", "replay them on a model with a longer context")
    raise KvauditError(f"{args.workload}: {len(over):,} request(s) need more prompt tokens than the engine takes "
                       f"({limit:,}: {why[0]}): {shown}{more}. A replay serves each request whole, never dropping "
                       f"documents; {why[1]}, or replay a workload of shorter requests (fewer or shorter documents).")


def _replay_one(args: argparse.Namespace, schedule: str, rate: float | None, seed: int, out_dir: Path,
                requests: list[Any], engine: _Engine) -> dict[str, Any]:
    """One replay at one load into ``out_dir`` (resumed where it holds records); its summary."""
    from kvaudit.core.jsonio import file_sha256
    from kvaudit.core.progress import progress_bar
    from kvaudit.core.replay_format import ReplayConfig, ReplayDir
    from kvaudit.replay.serve import (
        check_waves_fit,
        prompt_maker,
        replay_scheduled,
        request_kv,
    )
    from kvaudit.replay.summary import served_here, summarise
    from kvaudit.replay.workload_text import request_cases
    from kvaudit.runners.prompt import full_prompt_tokens

    arrivals_spec, arrivals = _arrivals(args, requests, rate, seed)
    config = ReplayConfig(workload=str(args.workload), workload_hash=file_sha256(args.workload), policy=args.cache_policy,
                          budget_bytes=args.cache_budget, model=args.model, backend=args.backend,
                          concurrency=args.concurrency, max_new_tokens=args.max_new_tokens,
                          n_requests=len(requests), arrivals=arrivals_spec, schedule=schedule,
                          kv_space_bytes=args.kv_space, engine_role=engine.table.get("role"),
                          engine_change=engine.table.get("change"), engine_sha256=engine.table.get("sha256"))
    out = ReplayDir(out_dir)
    with out.lock("replay", create=True):
        out.check_resumable(config)
        done = {r.index for r in out.finished()}
        todo_requests = [r for r in requests if r.index not in done]
        if not todo_requests and out.summary_file.is_file():  # nothing left to serve: the summary stands
            summary = out.read_summary()
            _print_summary(summary, out_dir)
            return summary
        backend = engine.get()
        facts = dict(engine.facts)
        cases = list(zip(todo_requests, request_cases(todo_requests, engine.synth), strict=True))
        check_requests_fit(args, backend.max_prompt_tokens,
                           {r.id: full_prompt_tokens(c, segs, backend.tok) for r, (c, segs) in cases})
        todo = [(r.index, r.id, prompt_maker(case, segs, backend)) for r, (case, segs) in cases]
        if args.cache_policy == "segment" and schedule == "waves":  # every wave must fit: refused now, not mid-replay
            check_waves_fit([request_kv(make(), facts["stores_heads"]) for _, _, make in todo],
                            [rid for _, rid, _ in todo], concurrency=args.concurrency,
                            open_loop=arrivals is not None, bytes_per_token=facts["bytes_per_token"],
                            store_bytes=backend.store_budget_bytes(args.cache_budget), budget=args.cache_budget)
        out.write_config(config)
        at = f" at {rate:g}/s" + (f" seed {seed}" if args.replications > 1 else "") if rate else ""
        bar = progress_bar(total=len(todo), desc=f"replay {args.cache_policy}{at}",
                           unit="request", enabled=not args.no_progress)
        t0 = time.perf_counter()
        if arrivals is not None:  # a resumed session starts its clock at its first request's arrival
            times = [arrivals[r.index] for r in todo_requests]
            arrivals = [t - times[0] for t in times] if times else []
        engine.served = True
        # the prefix policy's heads as the engine's blocks, so the simulator shares what the engine shares
        head_block = facts["block_size"] if args.cache_policy == "prefix" else 0
        replay_scheduled(backend, args.cache_policy, todo, out, schedule=schedule, arrivals=arrivals,
                         concurrency=args.concurrency, template_len=engine.template_len, head_block=head_block,
                         progress=bar.update)
        bar.close()
        facts["wall_s_last_session"] = time.perf_counter() - t0
        summary = summarise(out.read_requests(), config, facts)
        summary["served"] = served_here()
        out.write_summary(summary)
    _print_summary(summary, out_dir)
    return summary


def write_sweep(out: Path, loads: list[tuple[float, list[tuple[int, str, dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """``OUT/sweep.json`` from each offered load's replications as (seed, folder in OUT, summary):
    one row per load, its replications' folders and the numbers across them
    (:func:`~kvaudit.replay.summary.load_across_replications`). Returns the rows."""
    from kvaudit.core.jsonio import write_json
    from kvaudit.core.run_format import SWEEP_FILE
    from kvaudit.replay.summary import load_across_replications

    rows = []
    for rate, done in loads:
        summaries = [s for _, _, s in done]
        rows.append({**load_across_replications(summaries), "rate": rate, "dir": done[0][1],
                     "replications": [{"seed": seed, "dir": name} for seed, name, _ in done],
                     "time_per_output_token_s": summaries[0].get("time_per_output_token_s")})
    first = loads[0][1][0][2]
    write_json(out / SWEEP_FILE, {"policy": first["config"]["policy"],
                                    "schedule": first["config"].get("schedule", "waves"), "loads": rows})
    return rows


def _print_sweep(out: Path, rows: list[dict[str, Any]]) -> None:
    """The sweep's table, as written to ``OUT/sweep.json``."""
    from kvaudit.core.run_format import SWEEP_FILE
    from kvaudit.replay.summary import UNCLAIMED_INTERVALS

    k = len(rows[0]["replications"])
    print(f"\nsweep of {len(rows)} loads" + (f", {k} replications each" if k > 1 else "") + f" in {out / SWEEP_FILE}:")
    print("  offered/s  served/s  TTFT p50 [95% interval]     p95                         hit    TTFT growth "
          "(s per s of arrivals)")
    for r in rows:
        t, g = r["ttft_s"], r["ttft_growth"]
        served = r["requests_per_s"] or 0.0
        grows = "–" if g is None else f"{g['slope']:+.3f}" + (" past saturation" if g["past_saturation"] else "")
        hit = "–" if r["token_hit_rate"] is None else f"{100 * r['token_hit_rate']:5.1f}%"
        print(f"  {r['rate']:>9g}  {served:>8.2f}  {_ms(t['p50'], 0, 8):<26}  {_ms(t['p95'], 0, 8):<26}  {hit}  {grows}")
    if k > 1:
        print(f"  each load's percentiles: the median over its {k} replications, the interval distribution-free over "
              "them (both ends from 6 replications)")
    elif not all(r["intervals_claimed"] for r in rows):
        print(f"  ({UNCLAIMED_INTERVALS}; --replications 6 gives intervals that hold)")
    if any(r["ttft_growth"] and r["ttft_growth"]["past_saturation"] for r in rows):
        print("  past saturation: TTFT grew over the replay, so its percentiles there describe the replay's length, "
              "not the load (docs/replay.md)")


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
           params={"workload": str(args.workload), "policy": args.cache_policy, "audit_sample": k},
           segments=segments, cases=cases, quiet=True)
    print(f"  audit sample: {len(cases)} requests as a dataset in {out} (kvaudit run --dataset {out} ...)")
