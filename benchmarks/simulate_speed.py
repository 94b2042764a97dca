"""How fast the cache simulator is: generate, write, read and simulate a large workload.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/simulate_speed.py [--requests 1000000] [--capacity 30GB]

Prints measured wall-clock seconds per stage and peak memory; the target is one million
requests through both policies in under a minute on a 2-core machine.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvaudit.generators.workload import WorkloadParams, generate, write_workload  # noqa: E402
from kvaudit.simulator.kv_bytes import parse_capacity, resolve_model  # noqa: E402
from kvaudit.simulator.prefix_cache import simulate_prefix  # noqa: E402
from kvaudit.simulator.segment_cache import simulate_segment  # noqa: E402
from kvaudit.simulator.trace import read_trace  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--capacity", default="30GB")
    ap.add_argument("--model", default="gpt-oss-120b")
    ap.add_argument("--skip-io", action="store_true", help="simulate the in-memory trace only")
    args = ap.parse_args()

    params = replace(WorkloadParams(), requests=args.requests)
    cap_tokens = parse_capacity(args.capacity) // resolve_model(args.model).bytes_per_token
    timings: dict[str, float] = {}

    def timed(name: str, fn, *a):
        t = time.perf_counter()
        out = fn(*a)
        timings[name] = time.perf_counter() - t
        print(f"{name:<22} {timings[name]:7.2f} s", flush=True)
        return out

    trace = timed("generate", generate, params)
    print(f"  {trace.n_requests:,} requests, {len(trace.kind):,} pieces, "
          f"{int(trace.tokens.sum()):,} prompt tokens")
    if not args.skip_io:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "workload.jsonl"
            timed("write jsonl", write_workload, path, trace, params)
            print(f"  {path.stat().st_size / 1e6:,.0f} MB")
            trace = timed("read + validate jsonl", read_trace, path)
    seg = timed("segment policy", simulate_segment, trace, cap_tokens)[0]
    pre = timed("prefix policy", simulate_prefix, trace, cap_tokens)
    tot = trace.request_tokens().sum()
    print(f"  token hit rate at {args.capacity}: segment {100 * seg.sum() / tot:.1f}%, "
          f"prefix {100 * pre.sum() / tot:.1f}%")
    both = timings["segment policy"] + timings["prefix policy"]
    print(f"both policies          {both:7.2f} s  ({args.requests / both:,.0f} requests/s)")
    print(f"read + both policies   {both + timings.get('read + validate jsonl', 0):7.2f} s")
    print(f"peak memory            {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:7.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
