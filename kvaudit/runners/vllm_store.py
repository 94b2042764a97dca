"""The vLLM connector's segment store: KV tensors on the cache's own device, a byte budget, LRU.

One store lives in each vLLM worker process (see :mod:`kvaudit.runners.vllm_connector`). Entries
sit on the device the paged KV cache lives on (the GPU under CUDA, host memory under vLLM's CPU
build), laid out token-major as ``[layers, tokens, kv_heads, head_dim]`` so that a token's heads
are one contiguous row in the store and in vLLM's paged cache alike.

The budget is the store's own: :meth:`SegmentStore.put` evicts least recently used entries until
the new one fits and refuses an entry larger than the whole budget, so ``bytes_now`` never exceeds
``capacity_bytes`` (not even while one prompt's segments are being saved). Evicted keys are queued
for the frontend (:meth:`drain_evicted`) so its index forgets them too. No vLLM import here.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class StoredKV:
    """One entry: keys and values ``[layers, tokens, kv_heads, head_dim]`` in the cache dtype."""

    keys: torch.Tensor
    values: torch.Tensor
    start: int  # prompt position of the first token when computed
    _fingerprint: str = ""

    @property
    def n_tokens(self) -> int:
        return int(self.keys.shape[1])

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    @property
    def fingerprint(self) -> str:
        if not self._fingerprint:
            self._fingerprint = kv_fingerprint(self.keys, self.values)
        return self._fingerprint


def kv_fingerprint(keys: torch.Tensor, values: torch.Tensor) -> str:
    """A hash of the KV bytes. On the host: sha256 of the bytes. On a GPU: sha256 of per-layer
    int64 checksums computed on the device (a plain and a position-weighted word sum, so a
    permutation or any changed word shows), which avoids copying gigabytes to the host."""
    if keys.device.type == "cpu":
        h = hashlib.sha256()
        for t in (keys, values):
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:24]
    sums = []
    for t in (keys, values):
        flat = t.contiguous().view(t.shape[0], -1)
        words = flat.view(torch.int16) if flat.element_size() == 2 else flat.view(torch.int32)
        weight = torch.arange(words.shape[1], device=t.device, dtype=torch.int64) % 65521 + 1
        for layer in words:  # one layer at a time bounds the int64 temporaries
            w = layer.to(torch.int64)
            sums.append(torch.stack([w.sum(), (w * weight).sum()]))
    digest = torch.stack(sums).cpu().numpy().tobytes()
    return "d" + hashlib.sha256(digest).hexdigest()[:23]


@dataclass
class SegmentStore:
    """Byte-budgeted LRU store of :class:`StoredKV`; counters as the transformers backend's cache."""

    capacity_bytes: int
    entries: OrderedDict[str, StoredKV] = field(default_factory=OrderedDict)
    bytes_now: int = 0
    bytes_peak: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rejected: int = 0
    saves: int = 0
    loads: int = 0
    loaded_tokens: int = 0
    last_load_s: float = 0.0  # host time of the last load (building descriptors, launching)
    bytes_per_token: int = 0  # set by the connector once it knows the cache shape
    _evicted: list[str] = field(default_factory=list)
    _load_events: Any = None  # (start, end) CUDA events of the last load's kernel

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def get(self, key: str) -> StoredKV | None:
        """The entry, marked most recently used; counts a hit or a miss."""
        e = self.entries.get(key)
        if e is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return e

    def put(self, key: str, entry: StoredKV) -> bool:
        """Insert ``entry``, evicting least recently used entries until it fits. An entry larger than
        the whole budget is refused (returns False) and evicts nothing."""
        self.drop([key], evicted=False)
        if entry.nbytes > self.capacity_bytes:
            self.rejected += 1
            return False
        while self.entries and self.bytes_now + entry.nbytes > self.capacity_bytes:
            old, e = self.entries.popitem(last=False)
            self.bytes_now -= e.nbytes
            self.evictions += 1
            self._evicted.append(old)
        self.entries[key] = entry
        self.bytes_now += entry.nbytes
        self.bytes_peak = max(self.bytes_peak, self.bytes_now)
        self.saves += 1
        return True

    def drop(self, keys: list[str], *, evicted: bool = False) -> None:
        for k in keys:
            e = self.entries.pop(k, None)
            if e is not None:
                self.bytes_now -= e.nbytes
                if evicted:
                    self.evictions += 1
                    self._evicted.append(k)

    def set_capacity(self, capacity_bytes: int) -> None:
        """A new budget: evicts least recently used entries until the store fits; the peak restarts."""
        self.capacity_bytes = int(capacity_bytes)
        while self.entries and self.bytes_now > self.capacity_bytes:
            old, e = self.entries.popitem(last=False)
            self.bytes_now -= e.nbytes
            self.evictions += 1
            self._evicted.append(old)
        self.bytes_peak = self.bytes_now

    def drain_evicted(self) -> list[str]:
        """Keys evicted since the last call (the frontend's index drops them)."""
        out, self._evicted = self._evicted, []
        return out

    def info(self, keys: list[str] | None = None) -> dict[str, tuple[str, int, int, int]]:
        """key -> (fingerprint, tokens, bytes, start) for the present ones among ``keys``."""
        names = list(self.entries) if keys is None else keys
        return {k: (self.entries[k].fingerprint, self.entries[k].n_tokens, self.entries[k].nbytes,
                    self.entries[k].start) for k in names if k in self.entries}

    def stats(self) -> dict[str, Any]:
        kernel_s = None
        if self._load_events is not None:
            start, end = self._load_events
            end.synchronize()
            kernel_s = start.elapsed_time(end) / 1e3
        return {"entries": len(self.entries), "bytes": self.bytes_now, "bytes_peak": self.bytes_peak,
                "capacity_bytes": self.capacity_bytes, "hits": self.hits, "misses": self.misses,
                "evictions": self.evictions, "rejected": self.rejected, "saves": self.saves,
                "loads": self.loads, "loaded_tokens": self.loaded_tokens, "last_load_s": self.last_load_s,
                "last_load_kernel_s": kernel_s, "bytes_per_token": self.bytes_per_token}
