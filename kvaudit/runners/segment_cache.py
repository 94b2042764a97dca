"""Content-addressed store of segment KV with a byte budget and LRU eviction.

A key is (model fingerprint, hash of the segment unit's token ids, hash of the warm-up ids that
preceded it). An entry keeps only the segment's keys and values, stacked over layers as
``[layers, kv_heads, tokens, head_dim]``, and the position its first token had when it was
computed, so a reader can re-rotate it to any new position. The LRU itself is
:class:`~kvaudit.runners.kvstore.ByteLRU`, the one the vLLM connector's store uses too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvaudit.runners.kvstore import ByteLRU, kv_fingerprint, kv_nbytes


@dataclass(frozen=True)
class SegmentKey:
    model: str
    unit_hash: str
    warmup_hash: str
    policy: str = "neutral"


@dataclass
class SegmentKV:
    keys: torch.Tensor
    values: torch.Tensor
    start: int  # position of the first token when computed
    build_s: float = 0.0
    fingerprint: str = ""

    @property
    def nbytes(self) -> int:
        return kv_nbytes(self)

    @property
    def n_tokens(self) -> int:
        return int(self.keys.shape[2])

    def compute_fingerprint(self) -> str:
        # Host bytes on every device (the transformers backend's fingerprints have always been sha256
        # of the bytes, GPU or not).
        self.fingerprint = kv_fingerprint(self.keys.detach().cpu(), self.values.detach().cpu())
        return self.fingerprint


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    builds: int = 0
    build_s: float = 0.0
    bytes_now: int = 0
    bytes_peak: int = 0
    hit_tokens: int = 0


class SegmentCache:
    """Segment KV by :class:`SegmentKey` in a :class:`~kvaudit.runners.kvstore.ByteLRU`; an entry
    larger than the whole budget is kept alone (the prompt needs it)."""

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self.stats = CacheStats()
        self._lru: ByteLRU[SegmentKey, SegmentKV] = ByteLRU(capacity_bytes, kv_nbytes, oversize="keep")

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: SegmentKey) -> bool:
        return key in self._lru

    def get(self, key: SegmentKey) -> SegmentKV | None:
        entry = self._lru.get(key)
        if entry is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self.stats.hit_tokens += entry.n_tokens
        return entry

    def put(self, key: SegmentKey, entry: SegmentKV) -> None:
        _, evicted = self._lru.put(key, entry)
        self.stats.builds += 1
        self.stats.build_s += entry.build_s
        self.stats.evictions += len(evicted)
        self.stats.bytes_now = self._lru.bytes_now
        self.stats.bytes_peak = max(self.stats.bytes_peak, self.stats.bytes_now)
