"""Leak-probe candidate scoring over HTTP: one request at a time against ``SCORE_IN_FLIGHT`` at a
time after the first, side by side.

A leak probe's candidates (the true name and its 19 decoys) are scored by one request per distinct
candidate prefix, about 27 per arm and case (:mod:`kvaudit.runners.engines.http.backend`). This
script runs the same generated leak-probe cases (the HTTP benchmarks' Boxoffice set-up,
``boxoffice_behind_server``) under the two arms that score (``recompute``,
``reuse``) with the in-flight count set to 1 and to the shipped value, alternating (1, N, 1, N, ...),
against a running server with kvaudit's connector (``--base-url``) or one it starts on 127.0.0.1
(SmolLM2 fp32, the tests' launcher). Printed per run: the runner's wall time; then the median
ratio, and the largest difference between the two modes' candidate log-probabilities (the server
batches the concurrent requests, so the scores may differ in the last bits, never in which name
ranks where unless two are that close).

    .venv-vllm/bin/python benchmarks/http_scoring.py --cases 4 --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvaudit.cli import main as kvaudit_main  # noqa: E402
from kvaudit.core.run_format import read_pairs  # noqa: E402
from kvaudit.runners.engines.http import backend as http_backend  # noqa: E402


def run_once(url: str, ds: Path, out: Path, in_flight: int) -> float:
    http_backend.SCORE_IN_FLIGHT = in_flight
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = kvaudit_main(["run", "--backend", "openai", "--base-url", url, "--reuse-protocol", "kvaudit",
                             "--dataset", str(ds), "--out", str(out), "--arms", "recompute,reuse",
                             "--max-new-tokens", "4", "--no-progress"])
    if code != 0:
        raise SystemExit(f"kvaudit run exited {code} ({out})")
    return time.perf_counter() - t0


def scores(run: Path) -> dict[tuple[str, str, str], float]:
    return {(p.case_id, arm, name): lp for p in read_pairs(run) if p.canary
            for arm, res in p.arms.items() for name, lp in (res.canary_logprobs or {}).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default=None, help="a running server with kvaudit's connector (default: start one)")
    ap.add_argument("--cases", type=int, default=4, help="leak-probe cases")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    shipped = http_backend.SCORE_IN_FLIGHT
    work = Path(tempfile.mkdtemp(prefix="kvaudit-http-scoring-"))
    from kvaudit.testing.vllm_server import boxoffice_behind_server

    walls: dict[int, list[float]] = {1: [], shipped: []}
    runs: dict[int, Path] = {}
    with boxoffice_behind_server(args.base_url, work, args.cases, connector=True, families="leak_probe=1") as (ds, url):
        for r in range(args.repeats):
            for k in (1, shipped):
                runs[k] = work / f"run-{k}-{r}"
                walls[k].append(run_once(url, ds, runs[k], k))
                print(f"repeat {r}  in flight {k}: {walls[k][-1]:.1f} s", flush=True)
    http_backend.SCORE_IN_FLIGHT = shipped
    one, many = scores(runs[1]), scores(runs[shipped])
    if set(one) != set(many) or not one:
        raise SystemExit("the two modes scored different candidates")
    diff = max(abs(one[k] - many[k]) for k in one)
    print(f"median wall: in flight 1 {statistics.median(walls[1]):.1f} s, {shipped} "
          f"{statistics.median(walls[shipped]):.1f} s; ratio {statistics.median(walls[shipped]) / statistics.median(walls[1]):.2f}")
    print(f"candidate log-probabilities over {len(one)} (case, arm, name): largest difference between modes {diff:.2e}")


if __name__ == "__main__":
    main()
