"""How long the report takes to read a run: :func:`kvaudit.reports.analysis.load_run` on a
synthetic run of about 2,000 cases with its dataset on disk and a real, verified audit.

``load_run`` reads the manifest and ``pairs.jsonl``, verifies ``audit.json`` (hashes and a fresh
audit of the same records) and reads the case questions from the dataset. It prints the median
wall and CPU time of ``--repeats`` loads (CPU time is the steadier on a busy machine) and the audit state (which must be ``verified``, or the fresh
audit did not run). To compare two versions of kvaudit, run it from each checkout:
    .venv/bin/python benchmarks/load_run.py [--cases 2000] [--repeats 5]
    PYTHONPATH=/path/to/other/checkout .venv/bin/python benchmarks/load_run.py
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from kvaudit.cli import main as cli
from kvaudit.core.dataset_format import Case, DatasetCard, Segment, write_dataset
from kvaudit.core.jsonio import read_json, write_json
from kvaudit.reports.analysis import load_run
from kvaudit.testing.synthetic import DEFAULT_LOSS, make_pairs, make_run


def build(base: Path, n_cases: int) -> Path:
    """A synthetic run of ``n_cases`` answer cases (plus 10 leak probes) whose manifest names a
    dataset on disk with the same cases, audited by ``kvaudit audit``."""
    pairs = make_pairs(n_per_task=n_cases // len(DEFAULT_LOSS), n_docs=200, leak_probes=10)
    seg_ids = sorted({s for p in pairs for s in p.segment_ids})
    segments = [Segment(id=s, text=f"Document {s}. " + "The film opened in spring. " * 40) for s in seg_ids]
    cases = [Case(id=p.case_id, task=p.task, segment_ids=p.segment_ids, question=f"Which film is {p.case_id}?",
                  answers=p.answers, metric=p.metric, evidence=p.evidence, strata=p.strata, canary=p.canary)
             for p in pairs]
    card = DatasetCard(generator="synthetic")
    write_dataset(base / "data", segments, cases, card)
    run = make_run(base / "run", pairs, audit_passed=None)
    manifest = read_json(run / "manifest.json")
    manifest["dataset"].update(path=str(base / "data"), hash=card.content_hash)
    manifest["identity"]["dataset_hash"] = card.content_hash
    write_json(run / "manifest.json", manifest)
    assert cli(["audit", str(run)]) == 0
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = build(Path(tmp), args.cases)
        times, cpu, state = [], [], None
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            r = load_run(run)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            state = r.audit.state
        size = (run / "pairs.jsonl").stat().st_size
        print(f"load_run: {len(r.pairs)} cases ({size / 1e6:.1f} MB pairs.jsonl), audit {state}, "
              f"{len(r.questions)} questions: median wall {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}), median CPU {statistics.median(cpu):.3f} s (min {min(cpu):.3f}); "
              f"{args.repeats} loads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
