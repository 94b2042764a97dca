"""Run every policy at every capacity over one trace and summarise the hit rates.

Per policy and capacity the result holds the token hit rate (as defined in
:mod:`kvaudit.core.hit_rate`) over all requests, over a cold phase (the first
``cold_fraction`` of requests, while the cache fills) and over the warm rest, and over
consecutive windows of requests (hit rate over time).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvaudit.core.hit_rate import DEFINITION, token_hit_rate, windowed
from kvaudit.core.trace import Trace
from kvaudit.simulator.kv_bytes import KVShape, format_bytes
from kvaudit.simulator.prefix_cache import BLOCK_SIZE, simulate_prefix
from kvaudit.simulator.segment_cache import simulate_segment

POLICIES = ("segment", "prefix")


@dataclass
class SimConfig:
    capacities: list[int]  # bytes
    model: KVShape
    policies: tuple[str, ...] = POLICIES
    block_size: int = BLOCK_SIZE
    capture: str = "neutral"
    segment_kinds: tuple[str, ...] = ("document",)
    cold_fraction: float = 0.2
    windows: int = 20
    labels: list[str] = field(default_factory=list)  # capacity labels as the user wrote them


def policy_hits(trace: Trace, policy: str, capacity_tokens: int, config: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    """Hit tokens and warm-up tokens per request for one policy at one capacity."""
    if policy == "prefix":
        hits = simulate_prefix(trace, capacity_tokens, config.block_size)
        return hits, np.zeros_like(hits)
    if policy == "segment":
        return simulate_segment(trace, capacity_tokens, config.capture, config.segment_kinds)
    raise ValueError(f"unknown policy {policy!r}")


def summarise(hits: np.ndarray, warmup: np.ndarray, prompt: np.ndarray, config: SimConfig) -> dict:
    n = len(prompt)
    cold_n = int(round(n * config.cold_fraction))
    total = token_hit_rate(hits, prompt)
    return {
        **total.to_dict(),
        "cold": {"request_range": [0, cold_n], **token_hit_rate(hits[:cold_n], prompt[:cold_n]).to_dict()},
        "warm": {"request_range": [cold_n, n], **token_hit_rate(hits[cold_n:], prompt[cold_n:]).to_dict()},
        "windows": windowed(hits, prompt, config.windows),
        "warmup_tokens": int(warmup.sum()),
        "prefill_tokens": int(prompt.sum() - hits.sum() + warmup.sum()),
    }


def simulate(trace: Trace, config: SimConfig, progress=None) -> dict:
    """Simulate every policy at every capacity; returns the ``simulation.json`` document."""
    prompt = trace.request_tokens()
    bpt = config.model.bytes_per_token
    labels = config.labels or [format_bytes(c) for c in config.capacities]
    results = []
    for policy in config.policies:
        for cap, label in zip(config.capacities, labels, strict=True):
            cap_tokens = cap // bpt
            hits, warmup = policy_hits(trace, policy, cap_tokens, config)
            results.append({"policy": policy, "capacity": label, "capacity_bytes": cap,
                            "capacity_tokens": int(cap_tokens),
                            **summarise(hits, warmup, prompt, config)})
            if progress:
                progress(results[-1])
    return {
        "definition": DEFINITION,
        "model": config.model.to_dict(),
        "block_size": config.block_size,
        "capture": config.capture,
        "segment_kinds": list(config.segment_kinds),
        "cold_fraction": config.cold_fraction,
        "workload": trace.summary(),
        "results": results,
    }


def table_rows(sim: dict) -> list[dict]:
    """One row per capacity with each policy's overall, cold and warm token hit rate."""
    rows: dict[str, dict] = {}
    for r in sim["results"]:
        row = rows.setdefault(r["capacity"], {"capacity": r["capacity"],
                                              "capacity_tokens": r["capacity_tokens"]})
        row[r["policy"]] = r["token_hit_rate"]
        row[f"{r['policy']}_cold"] = r["cold"]["token_hit_rate"]
        row[f"{r['policy']}_warm"] = r["warm"]["token_hit_rate"]
    return list(rows.values())


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def markdown_table(sim: dict) -> str:
    policies = list(dict.fromkeys(r["policy"] for r in sim["results"]))
    head = ["capacity", "tokens"] + [f"{p} {phase}" for p in policies for phase in ("all", "cold", "warm")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table_rows(sim):
        cells = [row["capacity"], f"{row['capacity_tokens']:,}"]
        for p in policies:
            cells += [_pct(row.get(p)), _pct(row.get(f"{p}_cold")), _pct(row.get(f"{p}_warm"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
