"""The vLLM connector's segment store: KV tensors on the cache's own device, a byte budget, LRU.

One store lives in each vLLM worker process (see :mod:`kvaudit.runners.engines.vllm.connector`). Entries
sit on the device the paged KV cache lives on (the GPU under CUDA, host memory under vLLM's CPU
build), laid out token-major as ``[layers, tokens, kv_heads, head_dim]`` so that a token's heads
are one contiguous row in the store and in vLLM's paged cache alike.

The budget is the store's own: :meth:`SegmentStore.put` evicts least recently used entries until
the new one fits and refuses an entry larger than the whole budget, so ``bytes_now`` never exceeds
``capacity_bytes`` (not even while one prompt's segments are being saved). The engine checks at
its start that the device has the budget free (:func:`free_bytes`): the store allocates as it fills,
so a budget the device cannot hold would otherwise fail mid-run, out of memory. Evicted keys are queued
for the frontend (:meth:`drain_evicted`) so its index forgets them too. The LRU is
:class:`~kvaudit.runners.kvstore.ByteLRU`, the one the transformers backend's cache uses. No vLLM
import here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from kvaudit.runners.kvstore import ByteLRU, kv_fingerprint, kv_nbytes

__all__ = ["SegmentStore", "StoredKV", "kv_fingerprint"]


@dataclass
class StoredKV:
    """One entry: keys and values ``[layers, tokens, kv_heads, head_dim]`` in the cache dtype."""

    keys: torch.Tensor
    values: torch.Tensor
    start: int  # prompt position of the first token when computed
    _fingerprint: str = ""
    # when the store took it (time.monotonic, the host clock every process of the machine shares):
    # with vLLM's asynchronous scheduling a warm-up's save runs one engine step before the frontend
    # sees the warm-up finish, and the replay's engine-order simulation must place it there
    stored_mono: float = 0.0

    @property
    def n_tokens(self) -> int:
        return int(self.keys.shape[1])

    @property
    def nbytes(self) -> int:
        return kv_nbytes(self)

    @property
    def fingerprint(self) -> str:
        if not self._fingerprint:
            self._fingerprint = kv_fingerprint(self.keys, self.values)
        return self._fingerprint


def free_bytes(device: Any) -> tuple[str, int]:
    """Where the store's KV lives and the bytes free there now: the GPU's free memory under CUDA,
    the host's available memory otherwise (vLLM's CPU build keeps the KV cache in host memory)."""
    if device is not None and torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return str(device), int(free)
    import psutil  # a dependency of vLLM, which this module runs under

    return "host memory", int(psutil.virtual_memory().available)


class SegmentStore:
    """Byte-budgeted LRU store of :class:`StoredKV` (a :class:`~kvaudit.runners.kvstore.ByteLRU`
    that refuses an entry larger than the budget); counters as the transformers backend's cache."""

    def __init__(self, capacity_bytes: int):
        self._lru: ByteLRU[str, StoredKV] = ByteLRU(capacity_bytes, kv_nbytes, oversize="refuse")
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.rejected = 0
        self.saves = 0
        self.loads = 0
        self.loaded_tokens = 0
        self.last_load_s = 0.0  # host time of the last load (building descriptors, launching)
        self.bytes_per_token = 0  # set by the connector once it knows the cache shape
        self._evicted: list[str] = []
        self._refused_mono: dict[str, float] = {}  # key -> when the store last refused it, until read
        self._load_events: Any = None  # (start, end) CUDA events of the last load's kernel

    @property
    def entries(self) -> dict[str, StoredKV]:
        return self._lru.entries

    @property
    def capacity_bytes(self) -> int:
        return self._lru.capacity_bytes

    @property
    def bytes_now(self) -> int:
        return self._lru.bytes_now

    @property
    def bytes_peak(self) -> int:
        return self._lru.bytes_peak

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: str) -> bool:
        return key in self._lru

    def get(self, key: str) -> StoredKV | None:
        """The entry, marked most recently used; counts a hit or a miss."""
        e = self._lru.get(key)
        if e is None:
            self.misses += 1
            return None
        self.hits += 1
        return e

    def put(self, key: str, entry: StoredKV) -> bool:
        """Insert ``entry``, evicting least recently used entries until it fits. An entry larger than
        the whole budget is refused (returns False) and evicts nothing."""
        entry.stored_mono = time.monotonic()
        stored, evicted = self._lru.put(key, entry)
        if not stored:
            self.rejected += 1
            self._refused_mono[key] = entry.stored_mono
            return False
        self._refused_mono.pop(key, None)
        self._note_evicted(evicted)
        self.saves += 1
        return True

    def pin(self, keys: list[str]) -> list[str]:
        """Mark ``keys`` used and hold them against eviction until :meth:`unpin` (a request in
        flight will load them); returns the ones present, which alone are pinned."""
        held = [k for k in keys if self.get(k) is not None]
        for k in held:
            self._lru.pin(k)
        return held

    def unpin(self, keys: list[str]) -> None:
        for k in keys:
            self._lru.unpin(k)

    def drop(self, keys: list[str], *, evicted: bool = False) -> None:
        for k in keys:
            if self._lru.pop(k) is not None and evicted:
                self._note_evicted([k])

    def set_capacity(self, capacity_bytes: int) -> None:
        """A new budget: evicts least recently used entries until the store fits; the peak restarts."""
        self._note_evicted(self._lru.resize(capacity_bytes))

    def _note_evicted(self, keys: list[str]) -> None:
        self.evictions += len(keys)
        self._evicted.extend(keys)

    def drain_evicted(self) -> list[str]:
        """Keys evicted since the last call (the frontend's index drops them)."""
        out, self._evicted = self._evicted, []
        return out

    def info(self, keys: list[str] | None = None) -> dict[str, tuple[str, int, int, int]]:
        """key -> (fingerprint, tokens, bytes, start) for the present ones among ``keys``."""
        names = list(self.entries) if keys is None else keys
        return {k: (self.entries[k].fingerprint, self.entries[k].n_tokens, self.entries[k].nbytes,
                    self.entries[k].start) for k in names if k in self.entries}

    def offered_at(self, keys: list[str]) -> dict[str, float]:
        """key -> when the store was offered it (``time.monotonic``): when it took the entry it
        holds, or last refused one (each refusal's time is given once), among ``keys``."""
        out = {k: self.entries[k].stored_mono for k in keys if k in self.entries}
        for k in keys:
            if k not in out and k in self._refused_mono:
                out[k] = self._refused_mono.pop(k)
        return out

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
