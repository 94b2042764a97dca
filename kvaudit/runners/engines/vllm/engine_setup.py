"""What the vLLM backend's frontend keeps beside the engine: the index of the workers' segment
stores, the merge of the workers' store replies, and the checks run before an engine starts.

:class:`SegmentIndex` is the frontend's view of the neutral segment entries (hit statistics and
what is present); the tensors and the byte budget live in the workers' stores
(:mod:`kvaudit.runners.engines.vllm.store`). :func:`check_parallelism` refuses a tensor or pipeline split
the model cannot take, with a message, before vLLM is asked to start; :func:`check_store_room` a
segment-store budget the device cannot hold beside the engine, once it has started.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.core.errors import KvauditError
from kvaudit.runners.segment_cache import CacheStats


@dataclass
class SegmentIndex:
    """The frontend's view of the neutral segment entries: hit statistics and what is present.

    The tensors and the byte budget live in the workers' stores
    (:mod:`kvaudit.runners.engines.vllm.store`, LRU within ``capacity_bytes`` per worker); the index
    forgets what a worker evicted at each :meth:`sync` and takes its byte counts from there.
    """

    capacity_bytes: int
    stats: CacheStats = field(default_factory=CacheStats)
    entries: OrderedDict[str, tuple[int, int, str]] = field(default_factory=OrderedDict)  # bytes, tokens, fp

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, key: str) -> tuple[int, int, str] | None:
        e = self.entries.get(key)
        if e is None:
            self.stats.misses += 1
            return None
        self.entries.move_to_end(key)
        self.stats.hits += 1
        self.stats.hit_tokens += e[1]
        return e

    def add(self, key: str, nbytes: int, n_tokens: int, fp: str, build_s: float) -> None:
        """Record an entry a worker now holds."""
        self.entries[key] = (nbytes, n_tokens, fp)
        self.stats.builds += 1
        self.stats.build_s += build_s

    def sync(self, evicted: list[str], worker_stats: dict[str, Any]) -> None:
        """Forget what the worker evicted; its byte counts (every entry, temporary ones too)."""
        for k in evicted:
            if self.entries.pop(k, None) is not None:
                self.stats.evictions += 1
        self.stats.bytes_now = int(worker_stats["bytes"])
        self.stats.bytes_peak = max(self.stats.bytes_peak, int(worker_stats["bytes_peak"]))


def combined_fingerprint(fps: list[str]) -> str:
    """One fingerprint for an entry held in shares by several workers (order-free)."""
    return fps[0] if len(fps) == 1 else hashlib.sha256("|".join(sorted(fps)).encode()).hexdigest()[:32]


def merge_worker_replies(op: str, replies: list[Any]) -> Any:
    """One reply from every worker's reply to the store operation ``op`` (see
    :func:`kvaudit.runners.engines.vllm.connector.store_rpc`), in rank order.

    ``info``/``lookup``/``pin``: the entries every worker holds, each (combined fingerprint, tokens, bytes
    summed over the workers, start); an entry whose tokens or start differ between ranks is an
    error (the ranks hold different KV for one key). ``evicted``: what any worker evicted (then
    no worker's share is usable). ``offered_at``: per entry every worker was offered, the latest of their
    times (the entry is whole once the last share is stored). ``stats``/``capacity``: each number the largest over the workers
    (the budget is per worker, so the fullest worker is the one that evicts), with ``workers`` and
    ``per_worker``. ``drop``: the most entries a worker still holds. ``get``: the first worker's.
    """
    if not replies:
        raise KvauditError(f"store operation {op!r}: no worker replied")
    if len(replies) == 1 and op not in ("stats", "capacity"):
        return replies[0]
    if op in ("info", "lookup", "pin"):
        out = {}
        for key in replies[0]:
            shares = [r.get(key) for r in replies]
            if any(sh is None for sh in shares):
                continue
            fp0, n0, _, start0 = shares[0]
            for rank, (_, n, _, start) in enumerate(shares[1:], 1):
                if (n, start) != (n0, start0):
                    raise KvauditError(f"segment KV {key}: rank {rank} holds {n} tokens from position {start}, "
                                       f"rank 0 {n0} from {start0}; the workers' stores disagree")
            out[key] = (combined_fingerprint([sh[0] for sh in shares]), n0, sum(sh[2] for sh in shares), start0)
        return out
    if op == "evicted":
        return list(dict.fromkeys(k for r in replies for k in r))
    if op == "offered_at":
        return {k: max(r[k] for r in replies) for k in replies[0] if all(k in r for r in replies)}
    if op in ("stats", "capacity"):
        merged: dict[str, Any] = {}
        for k in replies[0]:
            vals = [r.get(k) for r in replies]
            nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
            merged[k] = max(nums) if len(nums) == len(vals) else vals[0]
        merged["workers"] = len(replies)
        merged["per_worker"] = replies if len(replies) > 1 else []
        return merged
    if op == "drop":
        return max(replies)
    return replies[0]


DEFAULT_KV_CACHE_BYTES = 1 << 30  # the engine's KV space unless the caller sizes it
STORE_HEADROOM_BYTES = 1 << 30  # kept free beside the store: the allocator's rounding, the run's own needs


def check_store_room(rooms: list[tuple[str, int]], store_bytes: int, workers: int = 1) -> None:
    """Refuse a segment-store budget (``store_bytes`` per worker) that the device the store lives
    on cannot hold: ``rooms`` is each worker's (where, bytes free) once the engine holds its weights
    and KV space. The store allocates as documents arrive, so without this a budget past the free
    memory would stop a run out of memory midway, after part of its work."""
    where, free = min(rooms, key=lambda r: r[1])
    fits = free - STORE_HEADROOM_BYTES
    if store_bytes <= fits:
        return
    share = f", {store_bytes / 1e9:.1f} GB of it on each of {workers} workers" if workers > 1 else ""
    raise KvauditError(
        f"--cache-budget {store_bytes * workers / 1e9:.1f} GB{share}: the segment store keeps its KV in {where}, "
        f"where {free / 1e9:.1f} GB is free once the engine holds its weights and KV space; a budget of at most "
        f"{max(fits, 0) * workers / 1e9:.1f} GB fits there, {STORE_HEADROOM_BYTES >> 30} GiB kept free. Lower "
        "--cache-budget, or the engine's KV space (a replay sizes it for --concurrency requests of the "
        "workload's longest). The store fills as documents arrive: past the free memory the run would stop, "
        "out of memory, midway.")


def check_parallelism(model_dir: Path, tensor_parallel_size: int, pipeline_parallel_size: int) -> None:
    """Refuse, before an engine starts, a split the model cannot take: tensor parallelism must
    divide its attention heads and KV heads (each rank's connector store holds its own KV heads),
    pipeline parallelism must not exceed its layers."""
    from transformers import AutoConfig

    for name, v in (("--tensor-parallel-size", tensor_parallel_size), ("--pipeline-parallel-size", pipeline_parallel_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise KvauditError(f"{name} must be a positive integer, got {v!r}")
    cfg = AutoConfig.from_pretrained(model_dir)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    tp = tensor_parallel_size
    if heads % tp or (kv_heads % tp and tp % kv_heads):
        raise KvauditError(f"--tensor-parallel-size {tp} does not split {model_dir.name}: {heads} attention heads and "
                           f"{kv_heads} KV heads must divide by it (or the KV heads replicate evenly); try a size "
                           f"that divides {heads}")
    if pipeline_parallel_size > int(cfg.num_hidden_layers):
        raise KvauditError(f"--pipeline-parallel-size {pipeline_parallel_size} exceeds {model_dir.name}'s "
                           f"{cfg.num_hidden_layers} layers")
