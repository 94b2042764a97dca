"""What the vLLM backend's frontend keeps beside the engine: the index of the workers' segment
stores, and the checks run before an engine starts.

:class:`SegmentIndex` is the frontend's view of the neutral segment entries (hit statistics and
what is present); the tensors and the byte budget live in the workers' stores
(:mod:`kvaudit.runners.vllm_store`). :func:`check_parallelism` refuses a tensor or pipeline split
the model cannot take, with a message, before vLLM is asked to start.
"""

from __future__ import annotations

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
    (:mod:`kvaudit.runners.vllm_store`, LRU within ``capacity_bytes`` per worker); the index
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
