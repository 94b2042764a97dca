"""Throughput of an audit over HTTP: one case at a time vs ``--concurrent-cases N``, side by side.

Against a running OpenAI-compatible server (``--base-url``), or one this script starts on
127.0.0.1 (vLLM's OpenAI server with kvaudit's connector, SmolLM2 fp32, the tests' launcher) when
none is given. The same generated Boxoffice dataset runs ``--repeats`` times in each mode,
alternating (1, N, 1, N, ...), each a real run directory that is then audited. Printed per run:
the runner's wall time and its split, the audit's exit code; then the median ratio.

    .venv-vllm/bin/python benchmarks/http_throughput.py --cases 12 --concurrent 4 --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
from pathlib import Path

from kvaudit.cli import main as kvaudit_main
from kvaudit.core.manifest import read_manifest

ARMS = "recompute,reuse,identity,prefix_cache_cold,prefix_cache_flushed,prefix_cache,recompute_again"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default=None, help="a running server with kvaudit's connector (default: start one)")
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--concurrent", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--arms", default=ARMS)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvaudit-http-throughput-"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kvaudit.testing.vllm_server import boxoffice_behind_server

    with boxoffice_behind_server(args.base_url, work, args.cases, connector=True) as (ds, url):
        walls: dict[int, list[float]] = {1: [], args.concurrent: []}
        print(f"{'N':>3} {'runner wall':>11} {'audit rc':>8}  split (s)")
        for k in range(args.repeats):
            for n in (1, args.concurrent):
                out = work / f"run-{k}-{n}"
                rc = kvaudit_main(["run", "--backend", "openai", "--base-url", url, "--reuse-protocol", "kvaudit",
                                   "--dataset", str(ds), "--out", str(out), "--arms", args.arms,
                                   "--max-new-tokens", str(args.max_new_tokens), "--no-progress",
                                   "--concurrent-cases", str(n)])
                if rc != 0:
                    raise SystemExit(f"kvaudit run exited {rc} (N = {n})")
                with contextlib.redirect_stdout(io.StringIO()):  # the audit's table: in out/audit.json
                    audit_rc = kvaudit_main(["audit", str(out)])
                t = read_manifest(out).timing_s
                walls[n].append(t["wall"])
                split = ", ".join(f"{a} {v:.1f}" for a, v in t.items() if a != "wall")
                print(f"{n:>3} {t['wall']:>10.1f}s {audit_rc:>8}  {split}", flush=True)
    one, many = statistics.median(walls[1]), statistics.median(walls[args.concurrent])
    print(f"\n{args.cases} cases x {len(args.arms.split(','))} arms: median {one:.1f} s one at a time, {many:.1f} s "
          f"{args.concurrent} at a time: {one / many:.2f}x")


if __name__ == "__main__":
    main()
