"""Requests served at their arrival on the in-process vLLM engine, as a server serves them.

:func:`serve_arrivals` adds each request to the engine when it arrives and keeps stepping the
engine: a request that arrives while others run joins the running batch at the next engine step
(vLLM's own continuous batching), and its time to first token runs from its arrival, so queueing
is in it. A request is admitted when it has arrived and fewer than the engine's ``max_num_seqs``
requests are in flight (admitted, not finished); until then it waits, as in a server's waiting
queue, and holds nothing: a segment request pins entries and starts warm-ups only once admitted.
(Admitting at arrival let a queue past saturation pin the whole store: every later document
overflowed and the hit rate collapsed, 29.9% to 7.7% on the H100 at 2.5/s, while prefix caching's
lookup waits for vLLM's scheduler.) Three policies:

``recompute``  every request a full prefill under a fresh cache salt (nothing shared).
``prefix``     every request under the backend's one prefix-cache salt: vLLM's own prefix cache.
``segment``    kvaudit's segment store. Once admitted, a request plans its load in prompt order:
               its head and documents held in the store are pinned (a request in flight never
               has an entry evicted from under it); each missing one is built by a warm-up
               request (the head alone, or the neutral head and the document) in the same engine,
               sharing its batches; an entry another request is already warming is waited for,
               not built twice. Each pin of an entry no one pins and each warm-up takes room from
               the budget (less what is pinned and being warmed); at the first entry without room
               the plan stops: that entry and everything after it are prefilled by the request
               itself and counted as misses (``overflow_tokens``), never an error, and no warm-up
               is built only for the store to refuse it. When its warm-ups are done the request
               goes to the engine loading [head][documents] up to the first entry not held. Pins
               are released once the request's first token shows its load is done.

No kvaudit module above the engines is imported here; :mod:`kvaudit.replay.serve` turns the
outcomes into replay records.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvaudit.core.errors import KvauditError
from kvaudit.core.jsonio import ids_hash
from kvaudit.core.replay_format import POLICIES
from kvaudit.core.store_plan import plan_store_load

if TYPE_CHECKING:
    from kvaudit.runners.engines.vllm.backend import VllmBackend
    from kvaudit.runners.prompt import Prompt


@dataclass
class LiveJob:
    """One request to serve: its prompt and its arrival (seconds from the start of serving)."""

    tag: int
    prompt: Prompt
    arrival_s: float


@dataclass
class LiveOutcome:
    """One request as served. Times are seconds from the start of serving, except the durations."""

    tag: int
    arrival_s: float
    admitted_s: float  # when it was admitted: arrived, and a slot free (its pins and warm-ups start here)
    submitted_s: float  # when its own request went to the engine (after its warm-ups)
    first_token_s: float
    finish_s: float
    hit_tokens: int  # segment: head and documents loaded that it did not warm up itself
    warmup_tokens: int  # segment: loaded entries warmed up for it
    overflow_tokens: int  # segment: head or document tokens the store could not hold: prefilled
    prefix_cache_tokens: int  # prefix: what vLLM's own cache served
    decode_tokens: int
    engine_ttft_s: float | None
    # the client's overhead over vLLM's own first-token latency, split exactly in two on the wall
    # clock vLLM stamps with: before vLLM stamped the request's arrival (the client's submission),
    # and after vLLM stamped its first token (vLLM's output processing inside step(), then the
    # client); None without request stats
    before_engine_s: float | None = None
    after_engine_s: float | None = None
    # segment: per entry ([head][documents], prompt order), when the store took or refused this
    # request's warm-up of it (the worker's own stamp: with vLLM's asynchronous scheduling, its
    # default on CUDA, a step's saves run one step before the frontend sees the warm-up finish;
    # None for an entry it did not warm up)
    warmed_s: list[float | None] = field(default_factory=list)
    # when the engine step that first scheduled its own request began: its load from the store
    # runs in that step, after every admission before it (None without vLLM's request stats)
    loaded_s: float | None = None
    # times vLLM preempted its own request and the warm-ups it started (its KV space ran out
    # mid-batch): None without vLLM's request stats
    preemptions: int | None = None

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s


@dataclass
class _Live:
    job: LiveJob
    admitted_s: float
    entries: list[tuple[str, int, int, bool]] = field(default_factory=list)  # key, start, end, rerotate
    waiting: set[str] = field(default_factory=set)  # keys being warmed that it waits for
    warmed_here: set[str] = field(default_factory=set)
    pinned: list[str] = field(default_factory=list)
    held: set[str] = field(default_factory=set)  # keys the store holds for it (pinned)
    warmed_at: dict[str, float] = field(default_factory=dict)  # keys it warmed -> when their warm-up finished
    rid: str = ""
    submitted_s: float = 0.0
    first_s: float | None = None
    submitted_wall: float = 0.0  # submitted_s and first_s on the wall clock (vLLM's request stats use it)
    first_wall: float = 0.0
    n_load: int = 0
    hit: int = 0
    warm: int = 0
    overflow: int = 0
    warmup_preemptions: int | None = None  # of the warm-ups it started


def step_of(mono: float, step_mono: list[float]) -> int:
    """The engine step a ``time.monotonic`` stamp fell in, given each step's start (-1: before the first)."""
    return bisect_right(step_mono, mono) - 1


def on_serving_clock(mono: float, step_mono: list[float], step_at: list[float]) -> float | None:
    """A ``time.monotonic`` stamp on the serving clock, through the engine step it fell in: that
    step's start there (``step_at``) plus the time since (None before the first step)."""
    k = step_of(mono, step_mono)
    return None if k < 0 else step_at[k] + (mono - step_mono[k])


class _Server:
    def __init__(self, backend: VllmBackend, policy: str, clock: Callable[[], float]):
        self.b = backend
        self.policy = policy
        self.clock = clock
        self.t0 = clock()
        self.main: dict[str, _Live] = {}  # engine request id -> request
        self.warmups: dict[str, str] = {}  # engine request id -> key it saves
        self.waiters: dict[str, list[_Live]] = {}  # key being warmed -> requests waiting for it
        self.unpin: list[str] = []
        self.fp = backend.fingerprint[:16]
        self.in_flight = 0  # requests admitted and not finished
        # the store's budget in tokens, and what of it is spoken for: entries pinned by requests
        # in flight (key -> pins, none at 0) and entries being warmed (key -> tokens kept for them)
        self.capacity = backend.store_bytes // backend.bytes_per_token() if policy == "segment" else 0
        self.pins: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self.reserved: dict[str, int] = {}
        # each engine step's start, on vLLM's event clock (time.monotonic) and on the serving clock:
        # vLLM stamps when it first scheduled a request on the former
        self.step_mono: list[float] = []
        self.step_at: list[float] = []

    def now(self) -> float:
        return self.clock() - self.t0

    # ------------------------------------------------------------------ admission

    def admit(self, job: LiveJob) -> None:
        live = _Live(job, self.now())
        self.in_flight += 1
        if self.policy != "segment":
            self.submit(live)
            return
        p = job.prompt
        h = p.head_len
        if h:
            live.entries.append((f"head:{self.fp}:{ids_hash(p.ids[:h])}", 0, h, False))
        for (s, e), uh in zip(p.spans, p.segment_hashes, strict=True):
            live.entries.append((self.b._neutral_key(uh), s, e, True))
        for k, s, e, _ in live.entries:
            self.tokens.setdefault(k, e - s)
        keys = list(dict.fromkeys(k for k, *_ in live.entries))
        free = [k for k in keys if k not in self.waiters]
        held = self.pin(free) if free else {}
        room = self.capacity - sum(self.tokens[k] for k in self.pins) - sum(self.reserved.values())
        plan = plan_store_load(((k, self.tokens[k]) for k in keys), room, warming=self.waiters, held=held,
                               pinned=self.pins)
        for k in plan.wait:
            self.waiters[k].append(live)
            live.waiting.add(k)
        for k in plan.warm:
            self.warm_up(k, live)
            live.warmed_here.add(k)
            live.waiting.add(k)
        for k in plan.pin:
            self._hold(live, k)
        if len(plan.pin) < len(held):  # pinned by the call above, not loaded: given back now
            self.unpin += [k for k in held if k not in plan.pin]
            self.pin([])
        if not live.waiting:
            self.submit(live)

    def _hold(self, live: _Live, key: str) -> None:
        live.held.add(key)
        live.pinned.append(key)
        self.pins[key] = self.pins.get(key, 0) + 1

    def _release(self, live: _Live) -> None:
        for k in live.pinned:
            self.pins[k] -= 1
            if not self.pins[k]:  # only entries pinned now: the admission's sum stays short
                del self.pins[k]
        self.unpin += live.pinned
        live.pinned = []

    def pin(self, keys: list[str]) -> dict[str, Any]:
        unpin, self.unpin = self.unpin, []
        return self.b.store_rpc("pin", keys, unpin)

    def warm_up(self, key: str, live: _Live) -> None:
        p = live.job.prompt
        start, end = next((s, e) for k, s, e, _ in live.entries if k == key)
        if key.startswith("head:"):
            ids, save = p.ids[:end], [[key, 0, end]]
        else:
            n = len(self.b.neutral_head)
            unit = p.ids[start:end]
            ids, save = self.b.neutral_head + unit, [[key, n, n + len(unit)]]
        # pinned as it is stored: the warm-ups of one request must not evict each other
        rid = self.b._submit(ids, self.b._params(max_tokens=1, transfer={"save": save, "pin": True}))
        self.warmups[rid] = key
        self.waiters[key] = [live]
        self.reserved[key] = self.tokens[key]

    def warmed(self, keys: list[str], now: float) -> None:
        """Warm-ups of ``keys`` finished: the store pinned each entry it could hold for the request
        that warmed it; every other waiting request pins it too."""
        waiting = [(k, live) for k in keys for live in self.waiters.pop(k)]
        for k in keys:
            self.reserved.pop(k, None)
        others = [k for k, live in waiting if k not in live.warmed_here]
        held = self.pin(others) if others else {}
        saved = self.b.store_rpc("info", keys)
        offered = self.b.store_rpc("offered_at", keys)
        held.update(saved)
        for k in keys:
            if k in held:  # the frontend's index, whose evictions the replay counts
                fp, n, nbytes, _ = held[k]
                self.b.cache.add(k, nbytes, n, fp, 0.0)
        for k, live in waiting:
            live.waiting.discard(k)
            if k in live.warmed_here:  # stored or refused: the simulation decides again which
                t = on_serving_clock(offered[k], self.step_mono, self.step_at) if k in offered else None
                live.warmed_at[k] = now if t is None else min(t, now)
            if k in held:
                self._hold(live, k)
            if not live.waiting:
                self.submit(live)

    # ------------------------------------------------------------------ the engine

    def submit(self, live: _Live) -> None:
        b = self.b
        p = live.job.prompt
        transfer = None
        salt = b.prefix_salt if self.policy == "prefix" else None
        if self.policy == "segment":
            plan: list[list[Any]] = []
            loaded = set()
            for key, s, e, rerotate in live.entries:
                if key not in live.held:
                    break
                plan.append([key, s, rerotate])
                live.n_load = e
                loaded.add((key, s))
            for key, s, e, _ in live.entries:
                if (key, s) not in loaded:
                    live.overflow += e - s
                elif key in live.warmed_here:
                    live.warm += e - s
                else:
                    live.hit += e - s
            if plan:
                transfer = {"n_load": live.n_load, "plan": plan, "drop": []}
        params = b._params(max_tokens=b.decoding.max_new_tokens, transfer=transfer)
        live.submitted_s, live.submitted_wall = self.now(), time.time()
        live.rid = b._submit(p.ids, params, salt)
        self.main[live.rid] = live

    def step(self, done: Callable[[LiveOutcome], None]) -> None:
        """One engine step. Its warm-ups' saves happened inside it, before the requests whose first
        token it returned give their pins back: so the pins go after the step (one store call),
        and every event of the step carries the step's end time."""
        finished_warmups = []
        self.step_mono.append(time.monotonic())
        self.step_at.append(self.now())
        outs = self.b.engine.step()
        now, wall = self.now(), time.time()
        for out in outs:
            rid = out.request_id
            if rid in self.warmups:
                if out.finished:
                    self._check(out, f"warm-up of {self.warmups[rid]}")
                    key = self.warmups.pop(rid)
                    n = self.b.count_preemptions(getattr(out, "metrics", None))
                    if n is not None:  # the request that started it is the first to wait on it
                        starter = self.waiters[key][0]
                        starter.warmup_preemptions = (starter.warmup_preemptions or 0) + n
                    finished_warmups.append(key)
                continue
            live = self.main.get(rid)
            if live is None:
                continue
            if live.first_s is None and out.outputs and out.outputs[0].token_ids:
                live.first_s, live.first_wall = now, wall
                self._release(live)  # its load is done
            if out.finished:
                self._check(out, f"request {live.job.tag}")
                del self.main[rid]
                self.in_flight -= 1
                done(self._outcome(live, out, now))
        if finished_warmups:
            self.warmed(finished_warmups, now)
            self.b.sync_store()  # the frontend's index learns what the saves evicted
        if self.unpin:
            self.pin([])

    def _check(self, out: Any, what: str) -> None:
        if out.outputs and out.outputs[0].finish_reason == "error":
            raise KvauditError(f"vLLM failed the {what} in the engine (finish reason 'error'); see the engine's log")

    def _outcome(self, live: _Live, out: Any, now: float) -> LiveOutcome:
        from kvaudit.runners.engines.vllm.backend import engine_ttft

        first = live.first_s if live.first_s is not None else now
        metrics = getattr(out, "metrics", None)
        ttft = engine_ttft(metrics)
        own = self.b.count_preemptions(metrics)
        preempted = None if own is None else own + (live.warmup_preemptions or 0)
        arrived = getattr(metrics, "arrival_time", None)  # vLLM's wall-clock stamp of the request
        split = ttft is not None and isinstance(arrived, float) and arrived > 0 and live.first_wall > 0
        comp = out.outputs[0]
        cached = int(out.num_cached_tokens or 0)
        scheduled = getattr(metrics, "scheduled_ts", None)
        k = step_of(scheduled, self.step_mono) if isinstance(scheduled, float) and scheduled > 0 else -1
        if self.policy == "segment" and cached < live.n_load:
            raise KvauditError(f"request {live.job.tag}: vLLM loaded {cached} tokens, expected {live.n_load}")
        return LiveOutcome(
            tag=live.job.tag, arrival_s=live.job.arrival_s, admitted_s=live.admitted_s,
            submitted_s=live.submitted_s, first_token_s=first, finish_s=now, hit_tokens=live.hit,
            warmup_tokens=live.warm, overflow_tokens=live.overflow,
            prefix_cache_tokens=cached if self.policy == "prefix" else 0,
            decode_tokens=max(0, len(comp.token_ids) - 1), engine_ttft_s=ttft,
            before_engine_s=arrived - live.submitted_wall if split else None,
            after_engine_s=live.first_wall - (arrived + ttft) if split else None,
            warmed_s=[live.warmed_at.get(key) for key, *_ in live.entries],
            loaded_s=self.step_at[k] if k >= 0 else None, preemptions=preempted)


def serve_arrivals(backend: VllmBackend, policy: str, jobs: list[LiveJob], done: Callable[[LiveOutcome], None], *,
                   clock: Callable[[], float] = time.perf_counter,
                   sleep: Callable[[float], None] = time.sleep) -> None:
    """Serve ``jobs`` (in arrival order) at their arrival times, at most the engine's
    ``max_num_seqs`` admitted at once; ``done`` gets each request's outcome as it finishes.
    Returns when every request has finished."""
    if policy not in POLICIES:
        raise KvauditError(f"--cache-policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if backend.engine.has_unfinished_requests():
        raise KvauditError("the vLLM engine has requests in flight; serving arrivals needs it idle")
    limit = backend.engine.vllm_config.scheduler_config.max_num_seqs
    srv = _Server(backend, policy, clock)
    queue = deque(jobs)
    while queue or srv.main or srv.warmups:
        now = srv.now()
        while queue and queue[0].arrival_s <= now and srv.in_flight < limit:
            srv.admit(queue.popleft())
        if backend.engine.has_unfinished_requests():
            srv.step(done)
        elif queue:
            sleep(max(0.0, queue[0].arrival_s - srv.now()))
        elif srv.main or srv.warmups:
            raise KvauditError(f"vLLM has no request in flight but {len(srv.main)} requests and "
                               f"{len(srv.warmups)} warm-ups never finished")
    if srv.unpin:
        srv.pin([])
    backend.sync_store()
