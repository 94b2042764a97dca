"""How fast the cache simulator is: generate, write, read and simulate a large workload.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/simulate_speed.py [--requests 1000000] [--capacity 30GB]

Prints measured wall-clock and CPU seconds per stage, the load average and peak memory; the
target is one million requests through both policies in under a minute on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvaudit.core.trace import read_trace  # noqa: E402
from kvaudit.generators.workload import WorkloadParams, generate, write_workload  # noqa: E402
from kvaudit.simulator.kv_bytes import parse_capacity, resolve_model  # noqa: E402
from kvaudit.simulator.prefix_cache import simulate_prefix  # noqa: E402
from kvaudit.simulator.segment_cache import simulate_segment  # noqa: E402


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
    cpu: dict[str, float] = {}
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores "
          "(CPU seconds are the process's own; wall seconds include waiting for a core)")
    print(f"{'stage':<22} {'wall':>8} {'cpu':>8}")

    def timed(name: str, fn, *a):
        t, c = time.perf_counter(), time.process_time()
        out = fn(*a)
        timings[name] = time.perf_counter() - t
        cpu[name] = time.process_time() - c
        print(f"{name:<22} {timings[name]:7.2f}s {cpu[name]:7.2f}s", flush=True)
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
    both_cpu = cpu["segment policy"] + cpu["prefix policy"]
    read, read_cpu = timings.get("read + validate jsonl", 0.0), cpu.get("read + validate jsonl", 0.0)
    print(f"{'both policies':<22} {both:7.2f}s {both_cpu:7.2f}s  ({args.requests / both:,.0f} requests/s wall)")
    print(f"{'read + both policies':<22} {both + read:7.2f}s {both_cpu + read_cpu:7.2f}s")
    print(f"peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB; "
          f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
