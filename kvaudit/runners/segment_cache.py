"""Content-addressed store of segment KV with a byte budget and LRU eviction.

A key is (model fingerprint, hash of the segment unit's token ids, hash of the warm-up ids that
preceded it). An entry keeps only the segment's keys and values, stacked over layers as
``[layers, kv_heads, tokens, head_dim]``, and the position its first token had when it was
computed, so a reader can re-rotate it to any new position.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import torch


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
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    @property
    def n_tokens(self) -> int:
        return int(self.keys.shape[2])

    def compute_fingerprint(self) -> str:
        h = hashlib.sha256()
        for t in (self.keys, self.values):
            h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy())  # buffer, no copy
        self.fingerprint = h.hexdigest()[:24]
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


@dataclass
class SegmentCache:
    capacity_bytes: int
    stats: CacheStats = field(default_factory=CacheStats)
    _entries: OrderedDict[SegmentKey, SegmentKV] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: SegmentKey) -> bool:
        return key in self._entries

    def get(self, key: SegmentKey) -> SegmentKV | None:
        entry = self._entries.get(key)
        if entry is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        self.stats.hit_tokens += entry.n_tokens
        return entry

    def put(self, key: SegmentKey, entry: SegmentKV) -> None:
        if key in self._entries:
            self.stats.bytes_now -= self._entries.pop(key).nbytes
        self._entries[key] = entry
        self.stats.bytes_now += entry.nbytes
        self.stats.builds += 1
        self.stats.build_s += entry.build_s
        # Evict least recently used entries, never the one just added.
        while self.stats.bytes_now > self.capacity_bytes and len(self._entries) > 1:
            _, old = self._entries.popitem(last=False)
            self.stats.bytes_now -= old.nbytes
            self.stats.evictions += 1
        self.stats.bytes_peak = max(self.stats.bytes_peak, self.stats.bytes_now)
