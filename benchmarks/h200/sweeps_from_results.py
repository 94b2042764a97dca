"""Rebuild `kvaudit replay --rate` sweep folders from a GPU run's saved results, so that
`kvaudit compare` draws their page: replays of `replay_gpu.py --rates` made before it wrote
sweeps itself (2026-12-05 and earlier) kept only each load's config, request records (gzipped) and
the printed summaries. Each load is summarised again from its records with the current code (its
p50 and p95 checked against the saved summary's), and each policy's loads written as a sweep.

    python benchmarks/h200/sweeps_from_results.py benchmarks/h200/results-2026-12-05/replay-500 /tmp/h200-sweeps
    kvaudit compare /tmp/h200-sweeps/prefix /tmp/h200-sweeps/segment --slo-ttft 2 --out /tmp/h200-sweeps/page
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvaudit.core.replay_format import ReplayDir  # noqa: E402
from kvaudit.replay.replay_cli import write_sweep  # noqa: E402
from kvaudit.replay.summary import summarise  # noqa: E402


def main(results: Path, out: Path) -> None:
    for saved in sorted(results.glob("replay_load_*_arrivals.json")):
        policy = saved.name.split("_")[2]
        loads = []
        for s in json.loads(saved.read_text())[policy]:
            name = f"rate-{s['rate']:g}"
            d = ReplayDir(out / policy / name)
            d.path.mkdir(parents=True, exist_ok=False)
            shutil.copy(results / f"{policy}-{name}-replay_config.json", d.path / "replay_config.json")
            (d.path / "requests.jsonl").write_bytes(gzip.decompress((results / f"{policy}-{name}-requests.jsonl.gz").read_bytes()))
            again = summarise(d.read_requests(), d.read_config(), s["engine"])
            for q in ("p50", "p95"):
                if abs(again["ttft_s"][q]["value"] - s["ttft_s"][q]["value"]) > 1e-9:
                    raise SystemExit(f"{saved}: {name} {q} is {again['ttft_s'][q]['value']} from its records, "
                                     f"{s['ttft_s'][q]['value']} saved")
            d.write_summary(again)
            loads.append((s["rate"], [(s.get("seed", 0), name, again)]))
        write_sweep(out / policy, sorted(loads, key=lambda x: x[0]))
        print(f"{policy}: {len(loads)} loads in {out / policy}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: sweeps_from_results.py RESULTS_DIR OUT_DIR")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
