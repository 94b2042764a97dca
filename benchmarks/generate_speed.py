"""How long `kvaudit generate boxoffice` takes for many cases (target: 100,000 in under a minute).

Run by hand: ``.venv/bin/python benchmarks/generate_speed.py [--cases 100000] [--repeat 1]``.
Runs the real command in a subprocess (imports, world, cases, coverage and writing all
included), then times the phases in-process, and prints wall and CPU seconds. The machine's
load average is printed too: on a shared machine, wall time can be several times the CPU time.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_cli(cases: int, out: Path) -> tuple[float, float]:
    cpu0, t0 = _child_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvaudit.cli", "generate", "boxoffice", "--out", str(out),
                    "--cases", str(cases)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, _child_cpu() - cpu0


def time_phases(cases: int) -> dict[str, tuple[float, float]]:
    """Wall and CPU seconds of each phase, in-process."""
    from kvaudit.core.coverage import compute_coverage
    from kvaudit.core.jsonio import dump_jsonl
    from kvaudit.generators import boxoffice
    from kvaudit.generators.knobs import ReuseKnobs
    from kvaudit.generators.writing import fill_refs_buckets, paused_gc

    out: dict[str, tuple[float, float]] = {}
    clock = [time.perf_counter(), time.process_time()]

    def lap(name: str) -> None:
        now = [time.perf_counter(), time.process_time()]
        out[name] = (now[0] - clock[0], now[1] - clock[1])
        clock[:] = now

    with paused_gc():
        segments, cs, _ = boxoffice.generate(seed=0, knobs=ReuseKnobs(cases=cases))
        lap("draw cases")
        fill_refs_buckets(cs)
        compute_coverage(segments, cs)
        lap("coverage")
        rows = [asdict(c) for c in cs]
        lap("schema asdict")
        dump_jsonl(rows)
        lap("json dump")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            wall, cpu = time_cli(args.cases, Path(tmp) / f"run{i}")
            size = sum(f.stat().st_size for f in (Path(tmp) / f"run{i}").iterdir()) / 1e6
            print(f"kvaudit generate boxoffice --cases {args.cases}: {wall:.1f} s wall, "
                  f"{cpu:.1f} s CPU, {size:.0f} MB written "
                  f"({'under' if wall < 60 else 'OVER'} the 60 s target)")
    phases = time_phases(args.cases)
    print("phases in-process (wall / CPU s): "
          + ", ".join(f"{k} {w:.1f} / {c:.1f}" for k, (w, c) in phases.items()))
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
