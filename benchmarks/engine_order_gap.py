"""What is left of a segment replay's measured-vs-engine-order gap, from its recorded requests.

For each ``requests.jsonl`` (or ``.jsonl.gz``) of a ``kvaudit replay --schedule arrivals`` with
``--policy segment``: the measured hit rate, the engine-order simulation's gap with each load where
it was recorded (``loaded_s``, where the records have it), at the request's submission, and just
before its first token (the two ends a load can fall between), how many requests differ, and the
store's evictions measured beside the simulation's; and with each warm-up's store a step earlier
than the frontend saw it finish, where vLLM's asynchronous scheduling (its default on CUDA) ran it
(records from before the store stamped its own times, 2026-12-07). The budget comes from the replay's
``replay_config.json`` beside the records (``NAME-replay_config.json`` for ``NAME-requests.jsonl.gz``);
bytes per token from the ``replay.json`` beside them, else ``--bytes-per-token`` (131072: Llama-3.1-8B's
bf16 KV, for the results folders, which keep no ``replay.json``).

    python benchmarks/engine_order_gap.py benchmarks/h200/results-2026-12-06/h100-20GB/segment-*.jsonl.gz
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
from pathlib import Path

import numpy as np

from kvaudit.core.replay_format import RequestRecord, read_request_records
from kvaudit.replay.summary import simulated_hits


def read_records(path: Path) -> list[RequestRecord]:
    return sorted(read_request_records(path), key=lambda r: r.index)


def stores_a_step_earlier(recs: list[RequestRecord]) -> list[RequestRecord]:
    """Each warm-up's store moved from the frontend's time (records made before the store stamped
    its own, 2026-12-07) to the previous engine step's end: where vLLM's asynchronous scheduling
    ran it. A step's end is the latest time before it at which the frontend saw any step's output
    (a first token, a finish, a warm-up's end) or a step began (a load); never before the
    request's own admission."""
    ends = sorted({t for r in recs for t in (r.arrival_s + r.ttft_s, r.finish_s, r.loaded_s,
                                             *(r.piece_warmed_s or ())) if t is not None})

    def earlier(t: float, r: RequestRecord) -> float:
        k = bisect.bisect_left(ends, t) - 1
        return max(ends[k], r.arrival_s + r.queue_s + 1e-6) if k >= 0 else t

    return [dataclasses.replace(r, piece_warmed_s=None if r.piece_warmed_s is None else
                                [None if w is None else earlier(w, r) for w in r.piece_warmed_s]) for r in recs]


def config_for(path: Path) -> dict:
    name = path.name
    for suffix in ("requests.jsonl.gz", "requests.jsonl"):
        if name.endswith(suffix):
            return json.loads((path.parent / (name[: -len(suffix)] + "replay_config.json")).read_text())
    raise SystemExit(f"{path}: not a requests.jsonl(.gz)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--bytes-per-token", type=int, default=131072)
    args = ap.parse_args()
    for path in args.records:
        recs = read_records(path)
        summary = path.parent / "replay.json"
        per_token = (int(json.loads(summary.read_text())["engine"]["bytes_per_token"]) if summary.exists()
                     else args.bytes_per_token)
        capacity = int(config_for(path)["budget_bytes"]) // per_token
        measured = np.array([r.segment_hit_tokens for r in recs])
        prompt = sum(r.n_prompt_tokens for r in recs)
        placements = {"loads at submission": [dataclasses.replace(r, loaded_s=None) for r in recs],
                      "loads before first token": [dataclasses.replace(
                          r, loaded_s=r.arrival_s + r.ttft_s - 1e-6) for r in recs]}
        if all(r.loaded_s is not None for r in recs):
            placements = {"loads as recorded": recs, **placements}
        placements["stores a step earlier"] = stores_a_step_earlier(recs)
        print(f"{path.name}: {len(recs)} requests, budget {capacity} tokens, "
              f"measured hit {100 * measured.sum() / prompt:.2f}%, evictions {sum(r.evictions for r in recs):.0f}")
        for label, rs in placements.items():
            counts: dict[str, int] = {}
            sim = simulated_hits(rs, "segment", capacity, 0, True, engine_order=True, counts=counts)
            print(f"  {label:<25} gap {100 * (measured.sum() - sim.sum()) / prompt:+.2f} points, "
                  f"{int((measured != sim).sum())} requests differ ({int((measured < sim).sum())} measured below), "
                  f"simulated evictions {counts.get('evictions', 0)}")


if __name__ == "__main__":
    main()
