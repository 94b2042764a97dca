"""Serve a workload through a backend under one cache policy, one record per request.

The policies run the arms ``kvaudit run`` runs, so a replay's TTFT is measured by the same code
as an audit's:

``recompute``  the ``recompute`` arm: a full prefill of every prompt, nothing cached.
``prefix``     the ``prefix_cache_cold`` arm: the engine's own exact prefix cache on one cache
               shared by the whole replay. The engine is opened with KV space for the budget plus
               what the requests in flight need (:func:`engine_kv_bytes`), so what it can keep
               cached between requests is the budget (vLLM in process only).
``segment``    the ``reuse`` arm: documents from kvaudit's segment store, LRU within the budget,
               keys re-rotated; a document the store misses is warmed up with the neutral head
               *on the request path*, before the request's own prefill, and its time is in the
               request's TTFT (``warmup_s``); so is the head's own prefill where the engine needs it.

Two schedules. ``arrivals`` (open loop on in-process vLLM, the default there): each request goes to
the engine at its arrival and joins the running batch at the next engine step, as a server
serves it; the segment store holds its budget under concurrency by serving what it cannot hold
as misses (:mod:`kvaudit.runners.engines.vllm.live`, :func:`replay_arrivals`). ``waves`` (every
other replay, and ``--schedule waves`` for comparison): requests go in file order in waves. Closed loop: ``concurrency`` at a time, the next wave when every
request of the last has its answer. Open loop (arrival times: the workload's timestamps, or
Poisson at a rate): when the engine is free, the requests that have arrived by then (at most
``concurrency``) go as one wave, and each request's wait since its arrival is in its TTFT. A
wave is one engine batch: arrivals during a wave wait for the next one, which is coarser than
vLLM's own per-iteration scheduling (a request never joins a batch already running). A resumed replay starts its
session with an empty cache; records carry their session so the simulator is held to the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvaudit.core.arms import ARMS
from kvaudit.core.dataset_format import Case, Segment
from kvaudit.core.errors import KvauditError
from kvaudit.core.jsonio import ids_hash
from kvaudit.core.replay_format import ReplayDir, RequestRecord
from kvaudit.runners.backend import ArmRequest, Backend
from kvaudit.runners.prompt import Prompt, assemble

POLICY_ARM = {"recompute": "recompute", "prefix": "prefix_cache_cold", "segment": "reuse"}


def engine_kv_bytes(budget_bytes: int, concurrency: int, max_request_tokens: int, bytes_per_token: int,
                    block_size: int) -> int:
    """KV space for the ``prefix`` policy: the budget plus the blocks ``concurrency`` requests of
    ``max_request_tokens`` hold while in flight (each rounded up to whole blocks, plus one)."""
    blocks = -(-max_request_tokens // block_size) + 1
    return budget_bytes + concurrency * blocks * block_size * bytes_per_token


def store_budget(policy: str, budget_bytes: int) -> int:
    """The segment store's budget for a replay of ``policy``: the cache budget where the policy
    keeps segments (``segment``), none otherwise (prefix caching's budget is the engine's own KV
    space), so the engine's check that the store fits the device never refuses a replay that
    keeps nothing there (an H100's prefix replay at 20 GB was refused: 13.9 GB free beside it)."""
    return budget_bytes if policy == "segment" else 0


def stored_bytes_per_token(bytes_per_token: int, dtype: str, kv_cache_dtype: object = None) -> int:
    """KV bytes a token takes in the engine: the model's at ``dtype``, or one byte an element where
    the engine stores its KV cache in fp8 (vLLM's ``kv_cache_dtype`` "fp8", "fp8_e4m3", "fp8_e5m2")."""
    if str(kv_cache_dtype or "auto").startswith("fp8"):
        return bytes_per_token // {"float32": 4}.get(dtype, 2)
    return bytes_per_token


def replay_kv_bytes(policy: str, budget_bytes: int, concurrency: int, max_request_tokens: int,
                    bytes_per_token: int, block_size: int, kv_space: int | None = None) -> int:
    """KV space for a replay's in-process vLLM engine, every policy: ``concurrency`` requests of
    ``max_request_tokens`` in flight (the engine runs at most that many, a segment warm-up among
    them), or ``kv_space`` where the user gives their server's (``--kv-space``: requests then wait
    or are preempted for space, as there), and for ``prefix`` the budget on top, so what the engine
    keeps between requests is the budget; other policies get at least the engine's default space
    unless ``kv_space`` says. ``kvaudit replay`` and the GPU benchmark size their engines with this
    one rule, so their numbers describe the same engine."""
    from kvaudit.runners.engines.vllm.engine_setup import DEFAULT_KV_CACHE_BYTES

    if kv_space is not None:
        return kv_space + (budget_bytes if policy == "prefix" else 0)
    if policy == "prefix":
        return engine_kv_bytes(budget_bytes, concurrency, max_request_tokens, bytes_per_token, block_size)
    return max(engine_kv_bytes(0, concurrency, max_request_tokens, bytes_per_token, block_size),
               DEFAULT_KV_CACHE_BYTES)


@dataclass(frozen=True)
class RequestKV:
    """What one request keeps in the segment store while its wave is served: its document units
    (ids hash -> tokens, each stored once however many requests share it) and, on an engine that
    stores heads (vLLM), its head's tokens."""

    units: dict[str, int]
    head_tokens: int = 0


def request_kv(prompt: Prompt, stores_heads: bool) -> RequestKV:
    units = {h: e - s for (s, e), h in zip(prompt.spans, prompt.segment_hashes, strict=True)}
    return RequestKV(units, prompt.head_len if stores_heads else 0)


def wave_tokens(kvs: list[RequestKV]) -> int:
    """Tokens of segment KV a wave needs in the store at once: its distinct document units and
    every request's head (the vLLM backend's own check, ``_fits``, counts the same)."""
    units: dict[str, int] = {}
    for kv in kvs:
        units.update(kv.units)
    return sum(units.values()) + sum(kv.head_tokens for kv in kvs)


def wave_groups(n: int, concurrency: int, open_loop: bool) -> list[range]:
    """The requests a wave may hold. Closed loop: the waves themselves (``concurrency`` at a time,
    in order). Open loop: every ``concurrency`` consecutive requests (which of them arrive together
    is known only when they do)."""
    if not open_loop:
        return [range(k, min(n, k + concurrency)) for k in range(0, n, concurrency)]
    return [range(k, min(n, k + concurrency)) for k in range(max(1, n - concurrency + 1))]


def check_waves_fit(kvs: list[RequestKV], request_ids: list[str], *, concurrency: int, open_loop: bool,
                    bytes_per_token: int, store_bytes: int, budget: int) -> None:
    """Refuse, before any request is served, a segment replay whose waves cannot have their
    segment KV in the store together (the engine would stop at the first such wave): the error
    names the wave, its need, the budget, and the ``--cache-budget`` or ``--concurrency`` that fits.
    ``store_bytes`` is the store's budget in the unit of ``bytes_per_token``: each worker's share
    of ``budget`` on vLLM, ``budget`` itself in process."""
    def worst(c: int) -> tuple[int, range]:  # the wave needing the most bytes at concurrency c
        waves = wave_groups(len(kvs), c, open_loop)
        return max(((wave_tokens([kvs[i] for i in g]) * bytes_per_token, g) for g in waves),
                   key=lambda t: t[0], default=(0, range(0)))

    need, wave = worst(concurrency)
    if need <= store_bytes:
        return
    workers = max(1, round(budget / store_bytes))  # the budget is split evenly over vLLM's workers
    first, last = request_ids[wave[0]], request_ids[wave[-1]]
    what = (f"requests {first!r} to {last!r}, which may arrive together" if open_loop
            else f"the wave of requests {first!r} to {last!r}")
    fits_at = next((c for c in range(concurrency - 1, 0, -1) if worst(c)[0] <= store_bytes), None)
    lower = f" or --concurrency {fits_at}" if fits_at else ""
    raise KvauditError(f"--cache-budget {budget:,} B cannot hold the segment KV of {what} at --concurrency {concurrency}: "
                       f"{need // bytes_per_token:,} tokens ({need * workers:,} B) in the store at once; nothing "
                       f"was replayed. Use --cache-budget {need * workers} or more{lower}")


@dataclass
class Served:
    """One request as served: its prompt and record."""

    prompt: Prompt
    record: RequestRecord


def _pieces(prompt: Prompt, request_id: str, template_len: int, head_block: int = 0) -> tuple[list[str], list[int], list[str]]:
    """The prompt as the simulator sees it: the template start all requests share, the rest of
    the head, each document unit (by its ids hash), and the tail. With ``head_block`` (the prefix
    policy: the engine's block), the head is cut into whole blocks from the prompt's start, each
    keyed by every id up to its end as vLLM keys a block, then the rest: two heads that share a
    first block (the template and a shared timestamp prefix) share that piece, as the engine's
    prefix cache shares it."""
    ids, kinds, toks = [], [], []
    head = prompt.ids[: prompt.head_len]
    if head_block > 0:
        full = len(head) // head_block * head_block
        parts = [(f"hb:{ids_hash(head[:end])}", head[end - head_block:end])
                 for end in range(head_block, full + 1, head_block)]
        parts.append((f"head:{ids_hash(head)}", head[full:]))
    else:
        cut = template_len if 0 < template_len <= prompt.head_len else 0
        parts = [(f"tmpl:{ids_hash(head[:cut])}", head[:cut]), (f"head:{ids_hash(head[cut:])}", head[cut:])]
    for key, part in parts:
        if part:
            ids.append(key)
            kinds.append("prefix")
            toks.append(len(part))
    for (s, e), h in zip(prompt.spans, prompt.segment_hashes, strict=True):
        ids.append(f"seg:{h}")
        kinds.append("document")
        toks.append(e - s)
    tail = len(prompt.ids) - prompt.tail_start
    if tail:
        ids.append(f"tail:{request_id}")
        kinds.append("question")
        toks.append(tail)
    return ids, toks, kinds


def serve_wave(backend: Backend, policy: str, prompts: list[Prompt], request_ids: list[str], indices: list[int],
               wave: int, session: int, template_len: int, head_block: int = 0) -> list[RequestRecord]:
    """Serve ``prompts`` together under ``policy``; one record each."""
    spec = ARMS[POLICY_ARM[policy]]
    ev0 = backend.cache.stats.evictions
    t0 = time.perf_counter()
    outs = backend.run_arms(spec, [ArmRequest(p) for p in prompts])
    wall = time.perf_counter() - t0
    evictions = (backend.cache.stats.evictions - ev0) / len(prompts)
    warmup_s = sum(o.build_s for o in outs)  # the wave's warm-ups, one batch before any request of it
    head_s = max(o.head_s for o in outs)  # the wave's head requests where they go first (0 in-process vLLM)
    stores_heads = backend.stores_heads
    records = []
    for p, rid, idx, out in zip(prompts, request_ids, indices, outs, strict=True):
        res = out.result
        seg_tokens = p.tail_start - p.head_len
        prefix_hit = res.tokens_reused if policy == "prefix" else 0
        seg_hit = 0
        warm_tokens = 0
        if policy == "segment":
            held_head = stores_heads and out.head_s == 0 and not out.head_prefilled
            seg_hit = res.cache_hit_tokens + (p.head_len if held_head else 0)
            warm_tokens = seg_tokens - res.cache_hit_tokens
        ids, toks, kinds = _pieces(p, rid, template_len, head_block)
        records.append(RequestRecord(
            index=idx, request_id=rid, wave=wave, session=session, n_prompt_tokens=len(p.ids),
            head_tokens=p.head_len, segment_tokens=seg_tokens,
            ttft_s=warmup_s + head_s + (res.ttft_s - out.head_s), warmup_s=warmup_s, head_s=head_s,
            queue_s=warmup_s + head_s, prefix_cache_tokens=int(prefix_hit), segment_hit_tokens=int(seg_hit),
            warmup_tokens=int(warm_tokens), tokens_computed=len(p.ids) - int(prefix_hit) - int(seg_hit),
            evictions=evictions, wall_s=wall, ids_hash=p.ids_hash, piece_ids=ids, piece_tokens=toks,
            piece_kinds=kinds, truncated=bool(p.truncation.get("truncated")),
            engine_ttft_s=out.engine_ttft_s, client_request_ttft_s=res.ttft_s - out.head_s))
    return records


def _waves(n: int, concurrency: int, arrivals: list[float] | None,
           clock: Callable[[], float], sleep: Callable[[float], None]) -> Iterator[tuple[list[int], float]]:
    """Positions of each wave and the session time it starts at. Closed loop (no ``arrivals``):
    ``concurrency`` at a time, back to back. Open loop: when the engine is free, every request that
    has arrived by then (at most ``concurrency``) goes together; with none arrived, wait for the next."""
    k = 0
    while k < n:
        if arrivals is None:
            yield list(range(k, min(n, k + concurrency))), clock()
            k += concurrency
            continue
        now = clock()
        if arrivals[k] > now:
            sleep(arrivals[k] - now)
            now = clock()
        end = k
        while end < n and end - k < concurrency and arrivals[end] <= now:
            end += 1
        yield list(range(k, end)), now
        k = end


def replay(backend: Backend, policy: str, todo: list[tuple[int, str, Callable[[], Prompt]]], out: ReplayDir, *,
           concurrency: int, template_len: int, on_wave: Callable[[int], None] | None = None,
           arrivals: list[float] | None = None, head_block: int = 0) -> int:
    """Serve ``todo`` (index, request id, prompt maker) in waves, appending each wave's records
    (flushed and fsynced) before the next; returns the number served. ``arrivals`` (seconds from
    the session's start, one per request, non-decreasing) makes it open loop: a request's TTFT
    then includes its wait from arrival until its wave started (``queue_s``)."""
    if policy not in POLICY_ARM:
        raise KvauditError(f"--cache-policy must be one of {', '.join(POLICY_ARM)}, got {policy!r}")
    done = out.finished()
    session = max((r.session for r in done), default=-1) + 1
    wave = max((r.wave for r in done), default=-1) + 1
    served = 0
    t0 = time.perf_counter()
    with out.appending() as app:
        for pos, started in _waves(len(todo), concurrency, arrivals, lambda: time.perf_counter() - t0, time.sleep):
            chunk = [todo[i] for i in pos]
            prompts = [make() for _, _, make in chunk]
            records = serve_wave(backend, policy, prompts, [rid for _, rid, _ in chunk], [i for i, _, _ in chunk],
                                 wave, session, template_len, head_block)
            for i, rec in zip(pos, records, strict=True):
                if arrivals is not None:
                    waited = max(0.0, started - arrivals[i])
                    rec.queue_s += waited
                    rec.ttft_s += waited
                    rec.arrival_s = arrivals[i]
                app.append(rec)
            app.flush()
            served += len(chunk)
            wave += 1
            if on_wave is not None:
                on_wave(len(chunk))
    return served


def replay_arrivals(backend: Backend, policy: str, todo: list[tuple[int, str, Callable[[], Prompt]]], out: ReplayDir, *,
                    arrivals: list[float], template_len: int, head_block: int = 0,
                    on_request: Callable[[int], None] | None = None) -> int:
    """Serve ``todo`` at ``arrivals`` (seconds from the session's start), each request joining the
    engine's running batch at its arrival; each record is appended (flushed and fsynced) as its
    request finishes, so a killed replay loses only the requests in flight. Returns the number served."""
    from kvaudit.runners.engines.vllm.live import LiveJob, LiveOutcome, serve_arrivals

    if backend.name == "openai":
        return replay_arrivals_http(backend, policy, todo, out, arrivals=arrivals, template_len=template_len,
                                    head_block=head_block, on_request=on_request)
    if backend.name != "vllm":
        raise KvauditError("--schedule arrivals needs the in-process vLLM engine (--backend vllm) or a server "
                           "(--backend openai)")
    done = out.finished()
    session = max((r.session for r in done), default=-1) + 1
    prompts = [make() for _, _, make in todo]  # assembled before the clock starts: not on any request's path
    jobs = [LiveJob(k, p, a) for k, (p, a) in enumerate(zip(prompts, arrivals, strict=True))]
    seen = backend.cache.stats.evictions
    served = 0
    with out.appending() as app:
        def finished(o: LiveOutcome) -> None:
            # the store's evictions since the last request finished are charged to this one (they
            # happen on warm-ups' saves; the sum over the session is the store's count)
            nonlocal served, seen
            evicted, seen = backend.cache.stats.evictions - seen, backend.cache.stats.evictions
            idx, rid, _ = todo[o.tag]
            p = prompts[o.tag]
            ids, toks, kinds = _pieces(p, rid, template_len, head_block)
            hit = o.hit_tokens + o.prefix_cache_tokens
            stored = None
            if o.warmed_s:  # [head][documents] -> pieces: the head's entry is its template and head pieces
                head, docs = (o.warmed_s[0], o.warmed_s[1:]) if p.head_len else (None, o.warmed_s)
                n_head = sum(1 for k in kinds if k == "prefix")
                stored = [head] * n_head + list(docs) + [None] * (len(ids) - n_head - len(docs))
            app.append(RequestRecord(
                index=idx, request_id=rid, wave=-1, session=session, n_prompt_tokens=len(p.ids),
                head_tokens=p.head_len, segment_tokens=p.tail_start - p.head_len, ttft_s=o.ttft_s,
                warmup_s=o.submitted_s - o.admitted_s, head_s=0.0, queue_s=o.admitted_s - o.arrival_s,
                prefix_cache_tokens=o.prefix_cache_tokens, segment_hit_tokens=o.hit_tokens,
                warmup_tokens=o.warmup_tokens, tokens_computed=len(p.ids) - hit, evictions=float(evicted),
                wall_s=0.0, ids_hash=p.ids_hash, piece_ids=ids, piece_tokens=toks, piece_kinds=kinds,
                truncated=bool(p.truncation.get("truncated")), engine_ttft_s=o.engine_ttft_s,
                client_request_ttft_s=o.first_token_s - o.submitted_s, arrival_s=o.arrival_s,
                client_before_engine_s=o.before_engine_s, client_after_engine_s=o.after_engine_s,
                overflow_tokens=o.overflow_tokens, finish_s=o.finish_s, decode_tokens=o.decode_tokens,
                decode_s=o.finish_s - o.first_token_s, piece_warmed_s=stored, loaded_s=o.loaded_s,
                preemptions=o.preemptions))
            app.flush()
            served += 1
            if on_request is not None:
                on_request(1)

        serve_arrivals(backend, policy, jobs, finished)
    return served


def replay_scheduled(backend: Backend, policy: str, todo: list[tuple[int, str, Callable[[], Prompt]]], out: ReplayDir, *,
                     schedule: str, arrivals: list[float] | None, concurrency: int, template_len: int,
                     head_block: int = 0, progress: Callable[[int], None] | None = None) -> int:
    """Serve ``todo`` on ``schedule``: ``"arrivals"`` (each request joins the running batch at its
    arrival: :func:`replay_arrivals`) or ``"waves"`` (:func:`replay`, open loop where ``arrivals``
    is given). ``progress`` gets the number of requests as they finish. Returns the number served."""
    if schedule == "arrivals":
        if arrivals is None:
            raise KvauditError("the arrivals schedule needs arrival times (--rate or --timestamps)")
        return replay_arrivals(backend, policy, todo, out, arrivals=arrivals, template_len=template_len,
                               head_block=head_block, on_request=progress)
    return replay(backend, policy, todo, out, concurrency=concurrency, template_len=template_len,
                  on_wave=progress, arrivals=arrivals, head_block=head_block)


def replay_arrivals_http(backend: Backend, policy: str, todo: list[tuple[int, str, Callable[[], Prompt]]],
                         out: ReplayDir, *, arrivals: list[float], template_len: int, head_block: int = 0,
                         on_request: Callable[[int], None] | None = None) -> int:
    """Send each request of ``todo`` to the server at its arrival, on its own thread, whatever is in
    flight (the server batches them as its clients' requests), at most ``backend.concurrent_cases``
    at once: a request arriving when that many are in flight waits on the client, and that wait is
    in its TTFT (``queue_s``; ``vllm bench serve --max-concurrency`` counts it nowhere). Each record
    is appended (flushed and fsynced) when its answer is in. Returns the number served."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    spec = ARMS[POLICY_ARM[policy]]
    done = out.finished()
    session = max((r.session for r in done), default=-1) + 1
    prompts = [make() for _, _, make in todo]  # assembled before the clock starts: not on any request's path
    lock = threading.Lock()
    failed = threading.Event()  # a request failed: send no more; what finished is kept
    served = 0
    t0 = time.perf_counter()

    with out.appending() as app:
        def one(k: int) -> None:
            nonlocal served
            sent = time.perf_counter() - t0
            try:
                res = backend.run_arm(prompts[k], spec).result
            except BaseException:
                failed.set()
                raise
            idx, rid, _ = todo[k]
            p = prompts[k]
            ids, toks, kinds = _pieces(p, rid, template_len, head_block)
            waited = max(0.0, sent - arrivals[k])
            rec = RequestRecord(
                index=idx, request_id=rid, wave=-1, session=session, n_prompt_tokens=len(p.ids),
                head_tokens=p.head_len, segment_tokens=p.tail_start - p.head_len, ttft_s=waited + res.ttft_s,
                warmup_s=0.0, head_s=0.0, queue_s=waited, prefix_cache_tokens=0, segment_hit_tokens=0,
                warmup_tokens=0, tokens_computed=len(p.ids), evictions=0.0, wall_s=0.0, ids_hash=p.ids_hash,
                piece_ids=ids, piece_tokens=toks, piece_kinds=kinds, truncated=bool(p.truncation.get("truncated")),
                engine_ttft_s=None, client_request_ttft_s=res.ttft_s, arrival_s=arrivals[k],
                finish_s=sent + res.ttft_s + res.decode_s, decode_tokens=max(0, len(res.answer_ids) - 1),
                decode_s=res.decode_s)
            with lock:
                app.append(rec)
                app.flush()
                served += 1
                if on_request is not None:
                    on_request(1)

        workers = max(1, backend.concurrent_cases)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvaudit-arrival") as pool:
            futures = []
            for k, at in enumerate(arrivals):
                wait = at - (time.perf_counter() - t0)
                if wait > 0:
                    time.sleep(wait)
                if failed.is_set():
                    break
                futures.append(pool.submit(one, k))
            errors = [e for f in futures if (e := f.exception()) is not None]
        if errors:
            raise errors[0]
    return served


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """``n`` Poisson arrival times at ``rate`` per second (seeded: the same replay, the same times)."""
    import numpy as np

    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n)).tolist()


def prompt_maker(case: Case, segments: dict[str, Segment], backend: Backend) -> Callable[[], Prompt]:
    """Assemble the case's prompt when its wave comes (a long workload's prompts are never all held)."""
    return lambda: assemble(case, segments, backend.tok, backend.max_prompt_tokens)
