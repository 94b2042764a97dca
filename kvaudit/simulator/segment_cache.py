"""Segment caching: content-addressed pieces, reusable at any position, LRU within a token budget.

Each cacheable piece (documents by default) is stored once under its content id and hits
wherever it appears in a later prompt, whatever precedes it; its keys are re-rotated to the new
position on load. Everything else (prefix, question) is prefilled fresh. Hits are judged on the
cache as it stood when the request arrived; then the request's hit segments are refreshed and its
missed segments stored, and least recently used segments are evicted until the budget holds. A
segment larger than the whole budget is never stored.

How a missed segment's KV is made is a policy option; it moves compute, not hits:

``neutral``     a separate warm-up forward prefills the segment alone after a neutral prefix, so
                the cached KV has seen no user's context (counted as ``warmup_tokens``).
``first-user``  the KV is captured from the request that missed it: no extra forward, but the
                cached KV has attended to that user's prefix, which later users then inherit.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvaudit.core.store_plan import plan_store_load
from kvaudit.core.trace import KINDS, Trace

CAPTURE_MODES = ("neutral", "first-user")


def simulate_segment(trace: Trace, capacity_tokens: int, capture: str = "neutral",
                     kinds: tuple[str, ...] = ("document",)) -> tuple[np.ndarray, np.ndarray]:
    """Hit tokens and warm-up tokens per request under segment caching."""
    if capture not in CAPTURE_MODES:
        raise ValueError(f"capture must be one of {CAPTURE_MODES}, got {capture!r}")
    idx = np.flatnonzero(np.isin(trace.kind, [KINDS.index(k) for k in kinds]))
    # Per request, the slice of `idx` holding its cacheable pieces.
    bounds = np.searchsorted(idx, trace.offsets).tolist()
    content = trace.content[idx].tolist()
    tokens = trace.tokens[idx].tolist()
    neutral = capture == "neutral"
    hits = [0] * trace.n_requests
    warm = [0] * trace.n_requests
    lru: OrderedDict[int, int] = OrderedDict()  # content code -> tokens
    move, pop = lru.move_to_end, lru.popitem
    used = 0
    for r in range(trace.n_requests):
        a, b = bounds[r], bounds[r + 1]
        if a == b:
            continue
        hit = 0
        missed = []
        for i in range(a, b):
            c = content[i]
            if c in lru:
                hit += tokens[i]
                move(c)
            else:
                missed.append(i)
        hits[r] = hit
        w = 0
        for i in missed:
            c = content[i]
            t = tokens[i]
            if c in lru or t > capacity_tokens:  # a repeat within the request, or never fits
                continue
            lru[c] = t
            used += t
            w += t
        if neutral:
            warm[r] = w
        while used > capacity_tokens:
            used -= pop(last=False)[1]
    return np.array(hits, np.int64), np.array(warm, np.int64)


def simulate_segment_store(trace: Trace, capacity_tokens: int, *, kinds: tuple[str, ...] = ("document",),
                           stored_after: tuple[str, ...] = (), touch_on_load: bool = False,
                           late_stored_after_load: bool = False) -> np.ndarray:
    """Hit tokens per request when the store's operations are replayed in an engine's own order:
    the request's held pieces are marked used, its missing pieces are stored one by one in prompt
    order (each evicting least recently used entries until it fits, as
    :class:`~kvaudit.runners.kvstore.ByteLRU` does), then the pieces of ``stored_after`` kinds (the
    head, which vLLM's backend stores after the documents' warm-ups) are hit or stored the same
    way, and with ``touch_on_load`` every cached piece is marked used again in prompt order (the
    connector's load); ``late_stored_after_load`` stores a missing ``stored_after`` piece after that
    load instead (vLLM in-process computes a new head in the loading request's engine step and saves
    it at the step's end). :func:`simulate_segment` evicts once per request instead; the two differ
    only in which entries a full store gives up (``kvaudit replay`` reports both)."""
    wanted = {KINDS.index(k) for k in kinds} | {KINDS.index(k) for k in stored_after}
    late = {KINDS.index(k) for k in stored_after}
    lru: OrderedDict[int, int] = OrderedDict()
    used = 0
    hits = np.zeros(trace.n_requests, np.int64)
    offs = trace.offsets.tolist()
    kind, content, tokens = trace.kind.tolist(), trace.content.tolist(), trace.tokens.tolist()

    def put(c: int, t: int) -> None:
        nonlocal used
        if t > capacity_tokens:
            return
        while used + t > capacity_tokens:
            used -= lru.popitem(last=False)[1]
        lru[c] = t
        used += t

    for r in range(trace.n_requests):
        mine = [i for i in range(offs[r], offs[r + 1]) if kind[i] in wanted]
        first = [i for i in mine if kind[i] not in late]
        hit = 0
        for i in first:
            if content[i] in lru:
                lru.move_to_end(content[i])
                hit += tokens[i]
        for i in first:
            if content[i] not in lru:
                put(content[i], tokens[i])
        after_load = []
        for i in mine:
            if kind[i] in late:
                if content[i] in lru:
                    lru.move_to_end(content[i])
                    hit += tokens[i]
                elif late_stored_after_load:
                    after_load.append(i)
                else:
                    put(content[i], tokens[i])
        if touch_on_load:
            for i in mine:
                if content[i] in lru:
                    lru.move_to_end(content[i])
        for i in after_load:
            put(content[i], tokens[i])
        hits[r] = hit
    return hits


class _StoreInFlight:
    """The segment store with requests in flight (the rules of :func:`simulate_segment_store_at_arrivals`):
    LRU entries of content ids and their tokens, pins held by requests, pieces being warmed."""

    def __init__(self, capacity_tokens: int, n_requests: int) -> None:
        self.capacity = capacity_tokens
        self.lru: OrderedDict[int, int] = OrderedDict()
        self.pins: dict[int, int] = {}
        self.used = 0
        self.warming: dict[int, int] = {}  # piece -> request warming it
        self.reserved: dict[int, int] = {}  # piece being warmed -> its tokens, room kept for it
        self.waiters: dict[int, list[int]] = {}
        self.held: list[set[int]] = [set() for _ in range(n_requests)]
        self.warmed_by: list[set[int]] = [set() for _ in range(n_requests)]
        self.evictions = 0

    def pin(self, r: int, c: int, touch: bool = True) -> None:
        if touch:
            self.lru.move_to_end(c)
        self.pins[c] = self.pins.get(c, 0) + 1
        self.held[r].add(c)

    def put(self, c: int, t: int) -> bool:
        if sum(self.lru[p] for p in self.pins if self.pins[p] > 0) + t > self.capacity:
            return False
        for old in [k for k in self.lru if not self.pins.get(k)]:
            if self.used + t <= self.capacity:
                break
            self.used -= self.lru.pop(old)
            self.evictions += 1
        self.lru[c] = t
        self.used += t
        return True

    def admit(self, r: int, pieces: list[int], tokens: list[int]) -> None:
        """Request ``r`` is admitted: the held pieces it asks for are marked used, then its plan
        (:func:`kvaudit.core.store_plan.plan_store_load`, the live server's own) is carried out:
        pieces being warmed waited for, held ones pinned, missing ones warmed by it, up to the first
        piece without room (so a warm-up's entry is always stored)."""
        pinned = {p for p, n in self.pins.items() if n > 0}
        room = self.capacity - sum(self.lru[p] for p in pinned) - sum(self.reserved.values())
        first: dict[int, int] = {}  # piece -> its tokens, in prompt order
        for c, t in zip(pieces, tokens, strict=True):
            first.setdefault(c, t)
        for c in first:  # the store is asked for all of them at once: each held one marked used
            if c not in self.warming and c in self.lru:
                self.lru.move_to_end(c)
        plan = plan_store_load(first.items(), room, warming=self.warming, held=self.lru, pinned=pinned)
        for c in plan.wait:
            self.waiters.setdefault(c, []).append(r)
        for c in plan.pin:
            self.pin(r, c, touch=False)
        for c in plan.warm:
            self.warming[c] = r
            self.reserved[c] = first[c]
            self.warmed_by[r].add(c)

    def store(self, r: int, c: int, tokens: int) -> None:
        """Request ``r``'s warm-up of ``c`` offered to the store; if kept, it and its waiters pin it."""
        if c not in self.warmed_by[r] or self.warming.get(c) != r:
            return  # not its warm-up, or a repeat of a piece already stored
        self.reserved.pop(c, None)
        if self.put(c, tokens):
            for w in [r, *self.waiters.get(c, [])]:
                self.pin(w, c)
        self.warming.pop(c, None)
        self.waiters.pop(c, None)

    def loaded(self, r: int, pieces: list[int]) -> int:
        """How many of request ``r``'s pieces (prompt order) it loads: up to the first it does not hold."""
        return next((k for k, c in enumerate(pieces) if c not in self.held[r]), len(pieces))

    def load(self, r: int, pieces: list[int]) -> None:
        """Request ``r``'s load: the pieces it loads are read from the store, most recently used again."""
        for c in pieces[: self.loaded(r, pieces)]:
            self.lru.move_to_end(c)

    def release(self, r: int, pieces: list[int], tokens: list[int]) -> int:
        """Request ``r``'s first token: its hit tokens (the pieces it loaded that it did not warm
        itself), and its pins go."""
        n = self.loaded(r, pieces)
        hit = sum(t for c, t in zip(pieces[:n], tokens[:n], strict=True) if c not in self.warmed_by[r])
        for c in self.held[r]:
            self.pins[c] -= 1
        return hit


def simulate_segment_store_at_arrivals(trace: Trace, capacity_tokens: int, admitted: np.ndarray, ready: np.ndarray,
                                       released: np.ndarray, kinds: tuple[str, ...] = ("prefix", "document"),
                                       stored: list[list[float | None]] | None = None,
                                       loaded: np.ndarray | None = None,
                                       counts: dict[str, int] | None = None) -> np.ndarray:
    """Hit tokens per request when requests overlap in flight, under the rules of
    :mod:`kvaudit.runners.engines.vllm.live`, at the times they were served: at ``admitted`` a
    request walks its pieces in prompt order: pieces another request is warming are waited for,
    held pieces marked used and pinned, the others warmed by it, each pin of an unpinned piece and
    each warm-up taking room from the budget (less the pinned pieces and those being warmed), up
    to the first piece without room, where it stops; at its ``ready`` time (its warm-ups done) the
    pieces it warmed are stored in prompt order, each evicting unpinned least recently used
    entries (refused when only pinned ones could make room: with the room kept at admission, never);
    at its load it reads its pieces up to the first one not held, which
    marks them used again (the engine's load reads them from the store after the admissions
    before its step), and its pins go at ``released`` (its first token). A hit is a loaded piece
    it did not warm itself.
    ``stored`` (per request, per trace piece): when each piece it warmed was offered to the store,
    where known (the engine stores or refuses each warm-up's entry in the step that finishes the
    warm-up, which under vLLM's asynchronous scheduling is one step before the frontend sees it
    finish: placed at the frontend's time, 17 of 500 requests came out differently on the H100,
    2026-12-07); else at ``ready``. ``loaded`` (per request): when its load ran, the start of the engine step that
    first scheduled it, after every admission before that step (where known; else at ``ready``,
    which puts the load before admissions that came between its submission and that step:
    measured 2.3 points off on the CPU test's workload at 2 req/s, 2026-12-07). Loads of one step
    run in the order the requests were submitted. ``counts``, where given, gets the store's
    ``evictions``."""
    wanted = {KINDS.index(k) for k in kinds}
    offs = trace.offsets.tolist()
    kind, content, tokens = trace.kind.tolist(), trace.content.tolist(), trace.tokens.tolist()
    mine: list[list[int]] = [[i for i in range(offs[r], offs[r + 1]) if kind[i] in wanted]
                             for r in range(trace.n_requests)]
    store = _StoreInFlight(capacity_tokens, trace.n_requests)
    hits = np.zeros(trace.n_requests, np.int64)
    # events in time order; at one time (an engine step): stores first (prompt order: the step's
    # saves), then releases (the pins of the requests the step gave a first token), then
    # admissions, then loads (the next step's)
    load_at = ready if loaded is None else loaded
    events = [(float(released[r]), 1, 0.0, r, 0) for r in range(trace.n_requests)]
    events += [(float(admitted[r]), 2, 0.0, r, 0) for r in range(trace.n_requests)]
    events += [(float(load_at[r]), 3, float(ready[r]), r, 0) for r in range(trace.n_requests)]
    for r in range(trace.n_requests):
        for j, i in enumerate(range(offs[r], offs[r + 1])):
            if kind[i] in wanted:
                t = stored[r][j] if stored is not None and stored[r][j] is not None else ready[r]
                events.append((float(t), 0, 0.0, r, i))
    events.sort()
    for _, what, _, r, i in events:
        if what == 2:
            store.admit(r, [content[i] for i in mine[r]], [tokens[i] for i in mine[r]])
        elif what == 3:
            store.load(r, [content[i] for i in mine[r]])
        elif what == 0:
            store.store(r, content[i], tokens[i])
        else:
            hits[r] = store.release(r, [content[i] for i in mine[r]], [tokens[i] for i in mine[r]])
    if counts is not None:
        counts["evictions"] = store.evictions
    return hits
