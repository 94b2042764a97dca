"""Prefix caching as vLLM does it: a hash chain over fixed-size token blocks, LRU over blocks.

A request's tokens are cut into blocks of ``block_size``; only full blocks are cached, and each
block's hash covers its own tokens and, through its parent's hash, every token before it. A
request hits the longest run of leading blocks found in the cache and stops at the first miss, so
one changed token invalidates its own block and everything after it. A fully cached prompt still
recomputes its last token (vLLM does), so hits are capped at ``(prompt_tokens - 1) // block_size``
blocks. Freed blocks are evicted least recently used first, a request's tail blocks before its
head blocks (vLLM frees them in reverse order).

For speed the chain is kept per piece instead of per block: a piece's *node hash* covers its
content and every piece before it, and the node owns the full blocks that end inside it. Blocks
of one node are always touched together and evicted tail first, so the cache stores, per node,
how many of its head blocks are resident. This is exactly the block-level behaviour as long as
content ids name distinct token sequences (a changed token is a different piece).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvaudit.simulator.trace import Trace

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


def node_hashes(trace: Trace) -> np.ndarray:
    """Per piece, a 64-bit hash of its content id and all content ids before it in its request."""
    lengths = np.diff(trace.offsets)
    starts = trace.offsets[:-1]
    key = _mix(trace.content.astype(np.uint64))
    out = np.empty(len(trace.content), np.uint64)
    prev = np.zeros(trace.n_requests, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(lengths.max(initial=0))):
            req = np.flatnonzero(lengths > j)
            idx = starts[req] + j
            h = _mix(prev[req] ^ _mix(key[idx] + np.uint64(j)))
            out[idx] = h
            prev[req] = h
    return out


def owned_blocks(trace: Trace, block_size: int = BLOCK_SIZE) -> np.ndarray:
    """Per piece, how many full blocks end inside it (its share of the request's block chain)."""
    cum = np.cumsum(trace.tokens)
    before = np.repeat(cum[trace.offsets[:-1]] - trace.tokens[trace.offsets[:-1]], np.diff(trace.offsets))
    end = cum - before
    start = end - trace.tokens
    return end // block_size - start // block_size


def simulate_prefix(trace: Trace, capacity_tokens: int, block_size: int = BLOCK_SIZE) -> np.ndarray:
    """Hit tokens per request under vLLM-style prefix caching with ``capacity_tokens`` of KV."""
    capacity = capacity_tokens // block_size
    hashes = node_hashes(trace).tolist()
    owned = owned_blocks(trace, block_size).tolist()
    offs = trace.offsets.tolist()
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
            if o:
                res = get(hashes[i], 0)
                hit += res
                if res < o:
                    break
        hits[r] = min(hit, max_hit[r]) * block_size
        # Touch tail first so the head ends up most recent: evicted last.
        for i in range(b - 1, a - 1, -1):
            o = owned[i]
            if o:
                h = hashes[i]
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
