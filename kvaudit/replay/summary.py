"""A replay's numbers (``replay.json``): TTFT percentiles with intervals, TTFT against prompt length,
token hit rate overall and over time, throughput, and the cache simulator's prediction for the
same served prompts, budget and block size beside the measured hit rate.

Percentile intervals are distribution-free (the binomial order-statistic interval of
``scipy.stats.quantile_test``): they assume only independent requests, and their coverage is
checked in ``benchmarks/replay_percentiles.py`` (a fast slice in the tests). Requests that queue
(open loop) or share a wave's batch are not independent: there the intervals claim no level
(``ttft_intervals_claimed``), and a load's replications give intervals that hold
(:func:`load_across_replications`). A percentile whose
interval has no upper order statistic in the sample (p99 of fewer than about 300 requests) gets
``null`` for that end: the sample cannot bound it.

The simulator is run on the prompts the engine was actually served (token counts after the chat
template, documents as the units the store keys), session by session (a resumed replay starts
its cache empty, so does the simulation), with the capacity the engine had: the segment store's
budget in tokens, or the engine's whole KV space for the prefix policy (vLLM keeps every freed
block cached until it needs the space).
"""

from __future__ import annotations

import math
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import quantile_test

from kvaudit.core.hit_rate import token_hit_rate, windowed
from kvaudit.core.replay_format import ReplayConfig, RequestRecord
from kvaudit.core.trace import Trace, trace_from_requests
from kvaudit.simulator.prefix_cache import simulate_prefix
from kvaudit.simulator.segment_cache import (
    simulate_segment,
    simulate_segment_store,
    simulate_segment_store_at_arrivals,
)
from kvaudit.stats.saturation import ttft_growth

PERCENTILES = (0.5, 0.95, 0.99)
UNCLAIMED_INTERVALS = ("requests queued (open loop) or shared a wave's batch: the intervals assume independent "
                       "requests and are too narrow there (simulated coverage of p95 0.20 at utilisation 0.8 on one "
                       "server, 0.37-0.62 in waves of 8), no level claimed (docs/replay.md, \"Intervals under load\")")
CONFIDENCE = 0.95
SIM_GAP_POINTS = 2.0  # a measured-vs-simulated gap above this is reported as a disagreement


def percentile_interval(x: np.ndarray, q: float, confidence: float = CONFIDENCE) -> dict[str, float | None]:
    """The ``q`` quantile of ``x`` and its distribution-free interval (``None`` for an end the
    sample cannot bound)."""
    x = np.asarray(x, np.float64)
    value = float(np.quantile(x, q, method="inverted_cdf"))
    if len(x) < 2:
        return {"value": value, "low": None, "high": None}
    ci = quantile_test(x, q=value, p=q).confidence_interval(confidence)
    return {"value": value,
            "low": float(ci.low) if math.isfinite(ci.low) else None,
            "high": float(ci.high) if math.isfinite(ci.high) else None}


def _session_traces(records: list[RequestRecord], merge_head: bool) -> list[tuple[list[int], Trace]]:
    """Per session: the positions of its records and their prompts as a trace."""
    out = []
    for s in sorted({r.session for r in records}):
        pos = [i for i, r in enumerate(records) if r.session == s]
        reqs = []
        for i in pos:
            r = records[i]
            pieces = list(zip(r.piece_kinds, r.piece_ids, r.piece_tokens, strict=True))
            if merge_head:  # the engine keeps the whole head as one store entry
                heads = [p for p in pieces if p[0] == "prefix"]
                rest = [p for p in pieces if p[0] != "prefix"]
                if heads:
                    pieces = [("prefix", "|".join(p[1] for p in heads), sum(p[2] for p in heads))] + rest
            reqs.append(pieces)
        out.append((pos, trace_from_requests(reqs)))
    return out


def _merged_warmed(r: RequestRecord) -> list[float | None]:
    """``piece_warmed_s`` aligned with the trace :func:`_session_traces` builds (the head's pieces
    merged into one, first)."""
    assert r.piece_warmed_s is not None
    heads = [t for k, t in zip(r.piece_kinds, r.piece_warmed_s, strict=True) if k == "prefix"]
    rest = [t for k, t in zip(r.piece_kinds, r.piece_warmed_s, strict=True) if k != "prefix"]
    return ([heads[0]] if heads else []) + rest


def simulated_hits(records: list[RequestRecord], policy: str, capacity_tokens: int, block_size: int,
                   stores_heads: bool, *, engine_order: bool = False, heads_after_load: bool = False,
                   counts: dict[str, int] | None = None) -> np.ndarray:
    """Hit tokens per record the simulator predicts for the same prompts and capacity;
    ``engine_order``: the segment store's operations in the backend's own order
    (:func:`~kvaudit.simulator.segment_cache.simulate_segment_store`; ``heads_after_load``: a new
    head is stored after the request's load, as vLLM in-process saves it at the end of that step;
    ``counts``: where given, gets the simulated store's ``evictions`` under arrivals, over all sessions)."""
    hits = np.zeros(len(records), np.int64)
    if policy == "recompute":
        return hits
    for pos, trace in _session_traces(records, merge_head=policy == "segment"):
        if policy == "prefix":
            h = simulate_prefix(trace, capacity_tokens, block_size)
        elif engine_order and all(records[i].finish_s is not None for i in pos):
            # served at their arrivals: the store's rules under overlap, at the times they were served
            rs = [records[i] for i in pos]
            one: dict[str, int] = {}
            admitted = np.array([(r.arrival_s or 0.0) + r.queue_s for r in rs])
            h = simulate_segment_store_at_arrivals(trace, capacity_tokens, admitted, admitted + np.array(
                [r.warmup_s for r in rs]), np.array([(r.arrival_s or 0.0) + r.ttft_s for r in rs]),
                kinds=("prefix", "document") if stores_heads else ("document",),
                stored=[_merged_warmed(r) for r in rs] if all(r.piece_warmed_s is not None for r in rs) else None,
                loaded=np.array([r.loaded_s for r in rs]) if all(r.loaded_s is not None for r in rs) else None,
                counts=one)
            if counts is not None:
                counts["evictions"] = counts.get("evictions", 0) + one["evictions"]
        elif engine_order:
            h = simulate_segment_store(trace, capacity_tokens, stored_after=("prefix",) if stores_heads else (),
                                       touch_on_load=stores_heads, late_stored_after_load=heads_after_load)
        else:
            kinds = ("document", "prefix") if stores_heads else ("document",)
            h, _ = simulate_segment(trace, capacity_tokens, "neutral", kinds)
        hits[pos] = h
    return hits


def _length_bins(n_tokens: np.ndarray, ttft: np.ndarray, bins: int = 5) -> list[dict[str, Any]]:
    """Median TTFT per prompt-length bin (bins by quantiles of length; equal lengths share one)."""
    edges = np.unique(np.quantile(n_tokens, np.linspace(0, 1, bins + 1)))
    out = []
    for k, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        sel = (n_tokens >= a) & ((n_tokens <= b) if k == len(edges) - 2 else (n_tokens < b))
        if sel.any():
            out.append({"tokens_low": int(a), "tokens_high": int(b), "requests": int(sel.sum()),
                        "ttft_p50_s": float(np.median(ttft[sel]))})
    return out


def summarise(records: list[RequestRecord], config: ReplayConfig, engine: dict[str, Any], *,
              windows: int = 10) -> dict[str, Any]:
    """``replay.json``: what one replay of one policy measured, beside the simulator's prediction.
    ``engine`` holds what the capacity depends on: ``block_size``, ``bytes_per_token``,
    ``kv_tokens`` (the engine's whole KV space in tokens), ``stores_heads``."""
    records = sorted(records, key=lambda r: r.index)
    ttft = np.array([r.ttft_s for r in records])
    prompt = np.array([r.n_prompt_tokens for r in records], np.int64)
    hits = np.array([r.prefix_cache_tokens + r.segment_hit_tokens for r in records], np.int64)
    measured = token_hit_rate(hits, prompt)
    if config.policy == "segment":
        capacity = config.budget_bytes // max(1, int(engine["bytes_per_token"]))
    else:
        capacity = int(engine.get("kv_tokens") or 0)
    sim = simulated_hits(records, config.policy, capacity, int(engine.get("block_size", 16)),
                         bool(engine.get("stores_heads")))
    predicted = token_hit_rate(sim, prompt)
    gap = 100 * (measured.rate - predicted.rate)
    in_order = None
    if config.policy == "segment":
        in_order = token_hit_rate(simulated_hits(records, "segment", capacity, 0, bool(engine.get("stores_heads")),
                                                 engine_order=True,
                                                 heads_after_load=bool(engine.get("heads_saved_after_load"))), prompt)
    busy = _busy_s(records)
    return {
        "config": {**config.identity(), "workload": config.workload},
        "engine": engine,
        "requests": len(records),
        "sessions": len({r.session for r in records}),
        "truncated_requests": sum(r.truncated for r in records),
        "preemptions": _preemptions(records),
        "ttft_s": {f"p{round(q * 100)}": percentile_interval(ttft, q) for q in PERCENTILES},
        # the intervals assume independent requests; requests that queue (open loop) or share a
        # wave's batch are not, and there they are too narrow (benchmarks/replay_percentiles.py
        # --queued, --waves): no level claimed
        "ttft_intervals_claimed": _alone(records),
        "ttft_mean_s": float(ttft.mean()),
        "queue_s": {"p50": float(np.median([r.queue_s for r in records])),
                    "p95": float(np.quantile([r.queue_s for r in records], 0.95))},
        "warmup_s_total": float(sum({r.wave: r.warmup_s for r in records}.values())),
        "ttft_by_length": _length_bins(prompt, ttft),
        "hit_rate": {
            "measured": measured.to_dict(),
            "prefix_cache_tokens": int(sum(r.prefix_cache_tokens for r in records)),
            "segment_hit_tokens": int(sum(r.segment_hit_tokens for r in records)),
            "warmup_tokens": int(sum(r.warmup_tokens for r in records)),
            # schedule "arrivals": what the store could not hold while other requests were in flight
            "overflow_tokens": int(sum(r.overflow_tokens for r in records)),
            "over_time": windowed(hits, prompt, windows),
            "simulated": predicted.to_dict(),
            "simulated_over_time": windowed(sim, prompt, windows),
            "simulator_capacity_tokens": capacity,
            "gap_points": gap,
            "simulator_agrees": abs(gap) <= SIM_GAP_POINTS,
            # the store's operations in the backend's own order: what is left of the gap once the
            # simulator's once-per-request eviction is replaced by the engine's (docs/replay.md)
            "simulated_engine_order": in_order.to_dict() if in_order is not None else None,
            "gap_points_engine_order": 100 * (measured.rate - in_order.rate) if in_order is not None else None,
        },
        "throughput": {
            "busy_s": busy,
            "requests_per_s": len(records) / busy if busy > 0 else None,
            "prompt_tokens_per_s": float(prompt.sum()) / busy if busy > 0 else None,
        },
        "evictions": float(sum(r.evictions for r in records)),
        "client_overhead_s": _client_overhead(records),
        "time_per_output_token_s": _tpot(records),
        "ttft_growth": _growth(records),
    }


def _alone(records: list[RequestRecord]) -> bool:
    """Whether each request was served on its own: a closed loop (no arrivals) of one request a wave."""
    waves = [(r.session, r.wave) for r in records]
    return all(r.arrival_s is None for r in records) and len(set(waves)) == len(waves)


def _growth(records: list[RequestRecord]) -> dict[str, Any] | None:
    """Open loop: TTFT's growth over the arrivals and whether the load was past saturation
    (:mod:`kvaudit.stats.saturation`), on the session that served the most requests (a resumed
    replay's sessions each count arrivals from their own start); None for a closed loop."""
    if not records or any(r.arrival_s is None for r in records):
        return None
    sessions = [r.session for r in records]
    main = max(set(sessions), key=sessions.count)
    mine = [r for r in records if r.session == main]
    return ttft_growth([r.arrival_s or 0.0 for r in mine], [r.ttft_s for r in mine])


def _preemptions(records: list[RequestRecord]) -> dict[str, int] | None:
    """How many requests vLLM preempted (theirs or their warm-ups') and how many times, where the
    records carry it (in-process vLLM with request stats, open loop); None where none does."""
    counts = [r.preemptions for r in records if r.preemptions is not None]
    if not counts:
        return None
    return {"requests": sum(n > 0 for n in counts), "total": int(sum(counts)), "recorded": len(counts)}


def _busy_s(records: list[RequestRecord]) -> float:
    """Seconds the engine was serving: the waves' wall times, or, where requests were served at
    their arrivals, each session's first arrival to its last finish."""
    waves = {r.wave: r.wall_s for r in records if r.finish_s is None}
    busy = float(sum(waves.values()))
    for s in {r.session for r in records if r.finish_s is not None}:
        mine = [r for r in records if r.session == s and r.finish_s is not None]
        busy += max(r.finish_s for r in mine) - min(r.arrival_s or 0.0 for r in mine)  # type: ignore[type-var]
    return busy


def _tpot(records: list[RequestRecord]) -> dict[str, Any] | None:
    """Time per output token after the first (decode time over decoded tokens), where requests
    decoded more than one token."""
    t = np.array([r.decode_s / r.decode_tokens for r in records
                  if r.decode_tokens and r.decode_s is not None])
    if not len(t):
        return None
    return {"requests": int(len(t)), "p50": percentile_interval(t, 0.5), "p95": percentile_interval(t, 0.95)}


def _client_overhead(records: list[RequestRecord]) -> dict[str, Any] | None:
    """kvaudit's client time on each request's own prefill: the TTFT the client measured for it
    minus the first-token latency the engine recorded for it (vLLM request stats; None where the
    engine keeps none)."""
    d = np.array([r.client_request_ttft_s - r.engine_ttft_s for r in records
                  if r.engine_ttft_s is not None and r.client_request_ttft_s is not None])
    if not len(d):
        return None
    out: dict[str, Any] = {"requests": int(len(d)), "p50": float(np.median(d)), "p95": float(np.quantile(d, 0.95)),
                           "max": float(d.max())}
    for part in ("before_engine", "after_engine"):  # arrivals: where it went (docs/replay.md)
        v = np.array([x for r in records if (x := getattr(r, f"client_{part}_s")) is not None])
        if len(v):
            out[part] = {"p50": float(np.median(v)), "p95": float(np.quantile(v, 0.95))}
    return out


def load_across_replications(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One offered load's numbers from its replications' summaries (the same workload and load,
    different arrival seeds): per TTFT percentile the median over replications with its interval
    (:mod:`kvaudit.stats.replications`; one replication: its own interval, claimed only for a
    closed loop), served requests per second and the growth rule's slope as the median and the
    largest, past saturation where any replication was (the SLO reading then drops the load),
    the token hit rate over all their requests."""
    from kvaudit.stats.replications import median_interval

    if len(summaries) == 1:
        s = summaries[0]
        ttft = {q: s["ttft_s"][q] for q in ("p50", "p95", "p99")}
        claimed = bool(s.get("ttft_intervals_claimed", True))
    else:
        ttft = {q: median_interval([s["ttft_s"][q]["value"] for s in summaries]) for q in ("p50", "p95", "p99")}
        claimed = True
    served = [s["throughput"]["requests_per_s"] for s in summaries if s["throughput"]["requests_per_s"] is not None]
    growths = [s["ttft_growth"] for s in summaries if s.get("ttft_growth")]
    hit = sum(s["hit_rate"]["measured"]["hit_tokens"] for s in summaries)
    prompt = sum(s["hit_rate"]["measured"]["prompt_tokens"] for s in summaries)
    return {"replications": len(summaries), "requests": sum(s["requests"] for s in summaries),
            "ttft_s": ttft, "intervals_claimed": claimed,
            "requests_per_s": float(np.median(served)) if served else None,
            "token_hit_rate": hit / prompt if prompt else None,
            "overflow_tokens": sum(s["hit_rate"].get("overflow_tokens", 0) for s in summaries),
            "ttft_growth": None if not growths else {
                "slope": float(np.median([g["slope"] for g in growths])),
                "largest": max(g["slope"] for g in growths),
                "past_saturation": any(g["past_saturation"] for g in growths)}}


BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def served_here() -> dict[str, str]:
    """``replay.json``'s ``served``: this machine and the time the replay finished. A comparison of
    replays made on other machines or hours apart says so (their latencies met different conditions).
    ``boot`` (Linux) tells machines apart that share a host name: leased GPU machines are all
    ``vm``, each lease a fresh boot."""
    out = {"host": platform.node(), "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        out["boot"] = BOOT_ID_FILE.read_text().strip()[:8]
    except OSError:
        pass
    return out
