"""Prefix caching as vLLM does it: a hash chain over fixed-size token blocks, LRU over blocks.

A request's tokens are cut into blocks of ``block_size``; only full blocks are cached, and each
block's hash covers its own tokens and, through its parent's hash, every token before it. A
request hits the longest run of leading blocks found in the cache and stops at the first miss, so
one changed token invalidates its own block and everything after it. A fully cached prompt still
recomputes its last token (vLLM does), so hits are capped at ``(prompt_tokens - 1) // block_size``
blocks. Freed blocks are evicted least recently used first, a request's tail blocks before its
head blocks (vLLM frees them in reverse order).

For speed the chain is kept per piece instead of per block: a piece's *node hash* (splitmix64,
64 bits) covers its content and every piece before it, and the node owns the full blocks that
end inside it. Blocks of one node are always touched together and evicted tail first, so the
cache stores, per node, how many of its head blocks are resident. This is exactly the block-level behaviour as long as
content ids name distinct token sequences (a changed token is a different piece).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvaudit.core.trace import Trace

BLOCK_SIZE = 16

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (uint64 arithmetic wraps, as intended)."""
    z = x + _GOLD
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def owned_blocks(trace: Trace, block_size: int = BLOCK_SIZE) -> np.ndarray:
    """Per piece, how many full blocks end inside it (its share of the request's block chain)."""
    cum = np.cumsum(trace.tokens)
    before = np.repeat(cum[trace.offsets[:-1]] - trace.tokens[trace.offsets[:-1]], np.diff(trace.offsets))
    end = cum - before
    start = end - trace.tokens
    return end // block_size - start // block_size


def _chain_entries(trace: Trace, block_size: int, merge_unique_tails: bool):
    """Per request, the LRU entries ``(hash, blocks)`` in prompt order, and their offsets.

    A node whose hash occurs once in the whole trace can never be hit, nor can any node after it
    in its request. From the first such node on, a request's blocks are merged into one entry:
    they would be its tail, touched together, never again, and evicted tail first, so one entry
    holding their sum behaves identically, and most requests of a workload with dynamic prefixes
    shrink from a dozen entries to one.
    """
    owned = owned_blocks(trace, block_size)
    offs = trace.offsets
    n = trace.n_requests
    lengths = np.diff(offs)
    key = _mix(trace.content.astype(np.uint64))
    h = np.zeros(len(key), np.uint64)  # filled up to each request's first never-repeated node
    first_once = offs[1:].copy()  # index of that node; the request's end when there is none
    prev = np.zeros(n, np.uint64)
    alive = np.arange(n)  # requests whose chain so far also occurs elsewhere
    with np.errstate(over="ignore"):
        for j in range(int(lengths.max(initial=0))):
            alive = alive[lengths[alive] > j]
            if not len(alive):
                break
            idx = offs[alive] + j
            hv = _mix(prev[alive] ^ _mix(key[idx] + np.uint64(j)))
            h[idx] = hv
            prev[alive] = hv
            if merge_unique_tails:
                # Equal nodes have equal parents, so counting among live chains is exact.
                _, inv, cnt = np.unique(hv, return_inverse=True, return_counts=True)
                once = cnt[inv] == 1
                first_once[alive[once]] = idx[once]
                alive = alive[~once]
    req = trace.request_index()
    idx = np.arange(len(h))
    in_tail = idx >= first_once[req]
    tail_blocks = np.bincount(req[in_tail], weights=owned[in_tail], minlength=n).astype(np.int64)
    keep = ~in_tail & (owned > 0)
    has_tail = tail_blocks > 0
    counts = np.bincount(req[keep], minlength=n) + has_tail
    entry_offs = np.concatenate([[0], np.cumsum(counts)])
    hashes = np.empty(entry_offs[-1], np.uint64)
    blocks = np.empty(entry_offs[-1], np.int64)
    # Kept entries keep their order; each request's merged tail goes after them.
    tails_before = np.cumsum(has_tail) - has_tail
    pos = np.arange(keep.sum()) + tails_before[req[keep]]
    hashes[pos], blocks[pos] = h[keep], owned[keep]
    tail_req = np.flatnonzero(has_tail)
    hashes[entry_offs[tail_req + 1] - 1] = h[first_once[tail_req]]
    blocks[entry_offs[tail_req + 1] - 1] = tail_blocks[tail_req]
    return hashes, blocks, entry_offs


def simulate_prefix(trace: Trace, capacity_tokens: int, block_size: int = BLOCK_SIZE,
                    merge_unique_tails: bool = True) -> np.ndarray:
    """Hit tokens per request under vLLM-style prefix caching with ``capacity_tokens`` of KV."""
    capacity = capacity_tokens // block_size
    h_arr, o_arr, off_arr = _chain_entries(trace, block_size, merge_unique_tails)
    hashes, owned, offs = h_arr.tolist(), o_arr.tolist(), off_arr.tolist()
    max_hit = ((trace.request_tokens() - 1) // block_size).tolist()
    hits = [0] * trace.n_requests
    lru: OrderedDict[int, int] = OrderedDict()  # node hash -> resident head blocks
    get, move, pop = lru.get, lru.move_to_end, lru.popitem
    used = 0
    for r in range(trace.n_requests):
        a, b = offs[r], offs[r + 1]
        hit = 0
        for i in range(a, b):
            o = owned[i]
            res = get(hashes[i], 0)
            hit += res
            if res < o:
                break
        hits[r] = min(hit, max_hit[r]) * block_size
        # Touch tail first so the head ends up most recent: evicted last.
        for i in range(b - 1, a - 1, -1):
            h = hashes[i]
            o = owned[i]
            res = get(h)
            if res is None:
                lru[h] = o
                used += o
            else:
                if res != o:
                    lru[h] = o
                    used += o - res
                move(h)
        while used > capacity:
            h, res = next(iter(lru.items()))
            excess = used - capacity
            if res <= excess:
                pop(last=False)
                used -= res
            else:  # evict only this node's tail blocks; it stays least recent
                lru[h] = res - excess
                used -= excess
    return np.array(hits, np.int64)
