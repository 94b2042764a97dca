"""Rebuild `kvaudit replay --rate` sweep folders from GPU runs' saved results, so that
`kvaudit compare` draws their page: each load a device job served is kept as its config, its request
records (gzipped) and the printed summaries (`replay_load_<policy>_arrivals*.json`), and one policy's
loads often come from several jobs (a load per device call). Each load is summarised again from its
records with the current code (its p50 and p95 checked against the saved summary's), and each
policy's loads, from every summary named, written as one sweep.

    python benchmarks/h200/sweeps_from_results.py /tmp/h200-sweeps benchmarks/h200/results-2026-12-05/replay-500
    python benchmarks/h200/sweeps_from_results.py /tmp/h100-sweeps \
        benchmarks/h200/results-2026-12-05/prefix500-h100/replay_load_prefix_arrivals.json \
        benchmarks/h200/results-2026-12-06/h100-20GB/replay_load_prefix_arrivals-rate-1.5.json ...
    kvaudit compare /tmp/h200-sweeps/prefix /tmp/h200-sweeps/segment --slo-ttft 2 --out /tmp/h200-sweeps/page

A folder stands for every summary in it; a load's files lie beside its summary
(`<policy>-rate-<R>-replay_config.json`, `<policy>-rate-<R>-requests.jsonl.gz`). Two summaries of one
policy at one load are refused: a sweep has one replay per load and seed.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvaudit.core.replay_format import ReplayDir  # noqa: E402
from kvaudit.replay.replay_cli import write_sweep  # noqa: E402
from kvaudit.replay.summary import summarise  # noqa: E402


def fail(message: str) -> NoReturn:
    """A usage or data error: named on stderr, exit status 2 (the project's contract for anything but a verdict)."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def saved_summaries(named: list[Path]) -> list[Path]:
    found: list[Path] = []
    for p in named:
        if not p.exists():  # the order before 2026-12-06 was RESULTS_DIR OUT_DIR: OUT_DIR now comes first
            fail(f"{p}: no such results folder or summary (usage: sweeps_from_results.py OUT_DIR RESULTS...)")
        found += sorted(p.glob("replay_load_*_arrivals*.json")) if p.is_dir() else [p]
    return found


def main(out: Path, named: list[Path]) -> None:
    loads: dict[str, dict[float, tuple[int, str, dict]]] = {}
    for saved in saved_summaries(named):
        results = saved.parent
        policy = saved.name.split("_")[2]
        for s in json.loads(saved.read_text())[policy]:
            name = f"rate-{s['rate']:g}"
            if s["rate"] in loads.get(policy, {}):
                fail(f"{saved}: {policy} at {name} is already given by another summary")
            d = ReplayDir(out / policy / name)
            d.path.mkdir(parents=True, exist_ok=False)
            shutil.copy(results / f"{policy}-{name}-replay_config.json", d.path / "replay_config.json")
            (d.path / "requests.jsonl").write_bytes(gzip.decompress((results / f"{policy}-{name}-requests.jsonl.gz").read_bytes()))
            again = summarise(d.read_requests(), d.read_config(), s["engine"])
            for q in ("p50", "p95"):
                if abs(again["ttft_s"][q]["value"] - s["ttft_s"][q]["value"]) > 1e-9:
                    fail(f"{saved}: {name} {q} is {again['ttft_s'][q]['value']} from its records, "
                         f"{s['ttft_s'][q]['value']} saved")
            if "served" in s:  # where and when: the page says whether the loads met the same conditions
                again["served"] = s["served"]
            d.write_summary(again)
            loads.setdefault(policy, {})[s["rate"]] = (s.get("seed", 0), name, again)
    for policy, by_rate in loads.items():
        write_sweep(out / policy, [(rate, [by_rate[rate]]) for rate in sorted(by_rate)])
        print(f"{policy}: {len(by_rate)} loads in {out / policy}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        fail("usage: sweeps_from_results.py OUT_DIR RESULTS_DIR_OR_SUMMARY...")
    main(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])
