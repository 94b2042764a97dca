"""Prefix vs segment cache token hit rates on a request workload (``kvaudit simulate``).

Writes ``DIR/simulation.json`` (per policy and capacity: token hit rate overall, cold and warm
phase, and per window of requests), ``DIR/simulation.md`` (the tables, also printed),
``DIR/hit_rate_vs_capacity.svg`` and ``DIR/hit_rate_over_time.svg``.
"""

from __future__ import annotations

import argparse
import sys
import time

from kvaudit.core.arg_types import byte_sizes, positive_int
from kvaudit.core.errors import KvauditError
from kvaudit.core.progress import add_progress_argument, progress_bar, progress_print
from kvaudit.core.trace import KINDS
from kvaudit.simulator.kv_bytes import DTYPE_BYTES, PRESETS, resolve_model
from kvaudit.simulator.segment_cache import CAPTURE_MODES

DEFAULT_CAPACITIES = "3GB,10GB,30GB,100GB,300GB,1TB"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--workload", required=True, help="request JSONL (kvaudit generate workload, or your own log)")
    a("--model-config", default="gpt-oss-120b", metavar="CONFIG_OR_NAME",
      help=f"preset ({', '.join(PRESETS)}), a config.json or its folder (default gpt-oss-120b)")
    a("--kv-dtype", choices=sorted(DTYPE_BYTES), help="KV element type (default: the model's dtype)")
    a("--cache-budget", "--capacity", dest="cache_budget", type=byte_sizes, default=DEFAULT_CAPACITIES,
      help=f"comma-separated cache budgets, e.g. 30GB or 512GiB (default {DEFAULT_CAPACITIES}; the name "
           "`kvaudit run` and `kvaudit replay` use; --capacity is its old name, still accepted)")
    a("--out", required=True, help="output directory")
    a("--policies", default="segment,prefix", help="comma-separated: segment, prefix")
    a("--block-size", type=positive_int, default=16, help="prefix-cache block size in tokens (default 16)")
    a("--capture", choices=CAPTURE_MODES, default="neutral",
      help="how a missed segment is cached: neutral warm-up forward, or captured from the first user")
    a("--segment-kinds", default="document",
      help="piece kinds the segment cache stores, comma-separated (default document)")
    a("--cold-fraction", type=float, default=0.2,
      help="share of requests counted as the cold phase (default 0.2)")
    a("--windows", type=positive_int, default=20, help="windows for hit rate over time (default 20)")
    add_progress_argument(parser)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _config(args: argparse.Namespace):
    from kvaudit.simulator.engine import POLICIES, SimConfig

    policies = tuple(_csv(args.policies))
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        raise KvauditError(f"--policies: unknown policy {bad[0] if bad else '(none)'!r}; known: {', '.join(POLICIES)}")
    kinds = tuple(_csv(args.segment_kinds))
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise KvauditError(f"--segment-kinds: unknown kind {bad[0] if bad else '(none)'!r}; known: {', '.join(KINDS)}")
    if args.block_size <= 0:
        raise KvauditError("--block-size must be positive")
    if not 0 <= args.cold_fraction < 1:
        raise KvauditError("--cold-fraction must be within [0, 1)")
    if args.windows <= 0:
        raise KvauditError("--windows must be positive")
    return SimConfig(capacities=[b for _, b in args.cache_budget], labels=[label for label, _ in args.cache_budget],
                     model=resolve_model(args.model_config, args.kv_dtype), policies=policies,
                     block_size=args.block_size, capture=args.capture, segment_kinds=kinds,
                     cold_fraction=args.cold_fraction, windows=args.windows)


def report_markdown(sim: dict) -> str:
    from kvaudit.simulator.engine import markdown_table

    w, m = sim["workload"], sim["model"]
    lines = [
        "# Cache simulation",
        "",
        f"- workload: {w['requests']:,} requests, {w['prompt_tokens']:,} prompt tokens "
        f"({w['mean_prompt_tokens']:.0f} per request), {w['distinct_documents']:,} distinct documents, "
        f"documents are {100 * w['document_token_share']:.1f}% of tokens",
        f"- model: {m['name']}, {m['bytes_per_token']:,} KV bytes per token",
        f"- prefix cache: {sim['block_size']}-token blocks; segment cache: {', '.join(sim['segment_kinds'])} "
        f"pieces, {sim['capture']} capture",
        f"- {sim['definition']}",
        f"- cold phase: the first {100 * sim['cold_fraction']:.0f}% of requests; warm: the rest",
        "",
        markdown_table(sim),
    ]
    lines += ["## Hit rate over time", "", "| requests | " + " | ".join(
        f"{r['policy']} @ {r['capacity']}" for r in sim["results"]) + " |",
        "|" + "---|" * (len(sim["results"]) + 1)]
    for i, win in enumerate(sim["results"][0]["windows"]):
        cells = [f"{win['start']}-{win['end']}"]
        for r in sim["results"]:
            v = r["windows"][i]["token_hit_rate"]
            cells.append("n/a" if v is None else f"{100 * v:.1f}%")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from kvaudit.core.jsonio import check_writable_dir, write_atomic, write_json
    from kvaudit.core.trace import read_trace
    from kvaudit.simulator.engine import markdown_table, simulate
    from kvaudit.simulator.plots import plot_over_time, plot_vs_capacity

    config = _config(args)
    out = check_writable_dir(args.out)  # before the simulation, not after it
    t0 = time.perf_counter()
    trace = read_trace(args.workload)
    print(f"read {trace.n_requests:,} requests in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    bar = progress_bar(total=len(config.policies) * len(config.capacities), desc="simulating",
                       unit="run", enabled=not args.no_progress)

    def progress(r: dict) -> None:
        progress_print(bar, f"  {r['policy']:>7} @ {r['capacity']:>6}: {100 * r['token_hit_rate']:.1f}%")
        bar.update()

    sim = simulate(trace, config, progress)
    bar.close()
    sim["workload"]["path"] = str(args.workload)
    write_json(out / "simulation.json", sim)
    write_atomic(out / "simulation.md", report_markdown(sim))
    plot_vs_capacity(sim, out / "hit_rate_vs_capacity.svg")
    plot_over_time(sim, out / "hit_rate_over_time.svg")
    print(markdown_table(sim), end="")
    print(f"wrote {out}/simulation.json, simulation.md, hit_rate_vs_capacity.svg, hit_rate_over_time.svg "
          f"({time.perf_counter() - t0:.1f}s)")
    return 0
