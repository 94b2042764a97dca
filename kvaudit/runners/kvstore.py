"""The segment-store parts every backend shares: one byte-budgeted LRU and one KV fingerprint.

:class:`ByteLRU` is the only least-recently-used bookkeeping in kvaudit: the transformers backend's
:class:`~kvaudit.runners.segment_cache.SegmentCache` and the vLLM connector's
:class:`~kvaudit.runners.engines.vllm.store.SegmentStore` both keep their entries in one, and differ only in
what they count and in what an entry larger than the whole budget does (``oversize``). No vLLM
import here.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import torch

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    """Entries with a byte size each, within ``capacity_bytes``, least recently used evicted first.

    ``oversize="keep"``: an entry larger than the budget is kept alone (everything else evicted);
    ``oversize="refuse"``: it is refused and evicts nothing, so ``bytes_now`` never exceeds the budget.
    A pinned entry (:meth:`pin`: a request in flight is about to load it) is never evicted; an
    entry that could fit only by evicting pinned ones is refused and evicts nothing.
    """

    def __init__(self, capacity_bytes: int, nbytes: Callable[[V], int], *, oversize: str = "keep"):
        if oversize not in ("keep", "refuse"):
            raise ValueError(f"oversize must be 'keep' or 'refuse', not {oversize!r}")
        self.capacity_bytes = int(capacity_bytes)
        self.oversize = oversize
        self._nbytes = nbytes
        self.entries: OrderedDict[K, V] = OrderedDict()
        self.bytes_now = 0
        self.bytes_peak = 0
        self._pins: dict[K, int] = {}  # key -> how many requests in flight hold it

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def get(self, key: K) -> V | None:
        """The entry, marked most recently used; None when absent."""
        e = self.entries.get(key)
        if e is not None:
            self.entries.move_to_end(key)
        return e

    def pin(self, key: K) -> bool:
        """Hold ``key`` against eviction (counted: each pin needs its :meth:`unpin`); False when absent."""
        if key not in self.entries:
            return False
        self._pins[key] = self._pins.get(key, 0) + 1
        return True

    def unpin(self, key: K) -> None:
        n = self._pins.get(key, 0) - 1
        if n > 0:
            self._pins[key] = n
        else:
            self._pins.pop(key, None)

    @property
    def pinned_bytes(self) -> int:
        return sum(self._nbytes(self.entries[k]) for k in self._pins if k in self.entries)

    def pop(self, key: K) -> V | None:
        self._pins.pop(key, None)
        e = self.entries.pop(key, None)
        if e is not None:
            self.bytes_now -= self._nbytes(e)
        return e

    def put(self, key: K, entry: V) -> tuple[bool, list[K]]:
        """Insert ``entry`` (replacing ``key``), evicting least recently used entries until it fits.

        Returns (stored, evicted keys in eviction order).
        """
        self.pop(key)
        size = self._nbytes(entry)
        if size > self.capacity_bytes and self.oversize == "refuse":
            return False, []
        if self._pins and self.pinned_bytes + size > self.capacity_bytes:
            return False, []  # only the entries in use could make room
        evicted = self._evict_until(self.capacity_bytes - size)
        self.entries[key] = entry
        self.bytes_now += size
        self.bytes_peak = max(self.bytes_peak, self.bytes_now)
        return True, evicted

    def resize(self, capacity_bytes: int) -> list[K]:
        """A new budget: evicts least recently used entries until the store fits; the peak restarts."""
        self.capacity_bytes = int(capacity_bytes)
        evicted = self._evict_until(self.capacity_bytes)
        self.bytes_peak = self.bytes_now
        return evicted

    def _evict_until(self, limit: int) -> list[K]:
        evicted = []
        for old in [k for k in self.entries if k not in self._pins]:  # least recently used first
            if self.bytes_now <= limit:
                break
            self.bytes_now -= self._nbytes(self.entries.pop(old))
            evicted.append(old)
        return evicted


def kv_nbytes(entry: Any) -> int:
    """Bytes of an entry's ``keys`` and ``values``."""
    return entry.keys.numel() * entry.keys.element_size() + entry.values.numel() * entry.values.element_size()


# int64 words a device checksum holds at once: layers are summed together up to this many (a
# short head in one group; a layer larger than this, as before, alone), so the temporaries never
# exceed what one layer at a time took: the engine leaves little GPU memory outside its KV cache
_CHECKSUM_WORDS = 1 << 24


def device_checksums(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Per layer of ``keys`` then ``values``: a plain and a position-weighted int64 sum of its
    16- or 32-bit words, shape ``(2 * layers, 2)``, on the tensors' device. Layers are summed in
    groups (a handful of kernel launches per group, not per layer) so that fingerprinting a short
    entry inside an engine step costs one synchronisation rather than hundreds of launches."""
    out = []
    for t in (keys, values):
        flat = t.contiguous().view(t.shape[0], -1)
        words = flat.view(torch.int16) if flat.element_size() == 2 else flat.view(torch.int32)
        weight = torch.arange(words.shape[1], device=t.device, dtype=torch.int64) % 65521 + 1
        step = max(1, _CHECKSUM_WORDS // max(words.shape[1], 1))
        for i in range(0, words.shape[0], step):
            w = words[i:i + step].to(torch.int64)
            out.append(torch.stack([w.sum(dim=1), (w * weight).sum(dim=1)], dim=1))
    return torch.cat(out)


def kv_fingerprint(keys: torch.Tensor, values: torch.Tensor) -> str:
    """A hash of the KV bytes. On the host: sha256 of the bytes. On a GPU: sha256 of
    :func:`device_checksums` (a plain and a position-weighted word sum per layer, so a permutation
    or any changed word shows), which avoids copying gigabytes to the host."""
    if keys.device.type == "cpu":
        h = hashlib.sha256()
        for t in (keys, values):
            h.update(t.detach().contiguous().view(torch.uint8).numpy())  # buffer, no copy
        return h.hexdigest()[:24]
    digest = device_checksums(keys, values).cpu().numpy().tobytes()
    return "d" + hashlib.sha256(digest).hexdigest()[:23]
