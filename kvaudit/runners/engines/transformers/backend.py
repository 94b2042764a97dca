"""The transformers backend: every arm of one prompt on a Hugging Face causal LM.

All arms start from the same :class:`~kvaudit.runners.prompt.Prompt`. Recompute arms prefill
every id. Reuse arms prefill the head fresh, take each segment's KV from a store (re-rotated to
its new position when the arm says so), and prefill the tail on top; no fresh tokens sit between
segments. Time to first token covers everything from cache lookup to the first token's argmax;
building segment KV (the one-time warm-up) is timed on its own.

**Repairs** (``blend@R``, ``epic@K``; :mod:`kvaudit.core.arms`) share one selective-recompute
mechanism, :meth:`TransformersBackend.recompute_tokens`: on the loaded prefix KV (fresh head and
re-rotated neutral segment KV, exactly what ``reuse`` uses) the tokens of a set S of segment
positions are run again at their own positions, their queries attending over the mixed cache
(the reused KV of every other token, the recomputed KV of S) and their keys and values replacing
the reused ones at every layer; then the tail is prefilled as in reuse. ``epic`` picks S by
position; ``blend`` by KV deviation: KV of the first :data:`~kvaudit.core.arms.BLEND_SELECT_LAYER`
+ 1 layers is computed in context and S is the share of segment tokens whose keys and values
deviate most from the reused ones at that layer. S empty runs nothing (bit-for-bit reuse); S
every segment token is a chunked full prefill (recompute, up to rounding). A repair's TTFT
includes its selection and its recomputation.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import torch

from kvaudit.core.arms import BLEND_SELECT_LAYER, ArmSpec, repair_count
from kvaudit.core.errors import KvauditError
from kvaudit.core.jsonio import ids_hash
from kvaudit.runners.backend import (
    ArmOutput,
    Backend,
    Decoding,
    build_arm_result,
    capture_source,
    model_shape_info,
)
from kvaudit.runners.prompt import Prompt, Tokenizer, neutral_head_ids
from kvaudit.runners.rope import RopeSpec
from kvaudit.runners.segment_cache import SegmentCache, SegmentKey, SegmentKV

__all__ = ["ArmOutput", "Decoding", "TransformersBackend"]  # Decoding and ArmOutput live in runners.backend


class TransformersBackend(Backend):
    name = "transformers"

    def __init__(self, model: Any, tokenizer: Any, fingerprint: str, *, decoding: Decoding | None = None,
                 cache_bytes: int = 2 << 30, device: str | None = None):
        self.model = model
        self.tok = Tokenizer(tokenizer)
        self.fingerprint = fingerprint
        self.decoding = decoding or Decoding()
        self.rope = RopeSpec.from_model(model)
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.cache = SegmentCache(cache_bytes)
        self.neutral_head = neutral_head_ids(self.tok)
        self.neutral_hash = ids_hash(self.neutral_head)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos = {int(e) for e in eos if e is not None} | (
            {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        )
        max_pos = int(getattr(model.config, "max_position_embeddings", 4096))
        self.max_prompt_tokens = max_pos - self.decoding.max_new_tokens
        if self.rope.sliding_window:
            self.max_prompt_tokens = min(self.max_prompt_tokens, self.rope.sliding_window)

    # ------------------------------------------------------------------ low level

    def info(self) -> dict[str, Any]:
        import transformers

        cfg = self.model.config
        return {
            "backend": self.name,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "device": str(self.device),
            "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
            "attn_implementation": getattr(cfg, "_attn_implementation", None),
            "logit_diff_kind": "logits",  # first_logits: the full logit vector
            **model_shape_info(cfg, self.rope, self.max_prompt_tokens, self.neutral_hash),
        }

    def new_cache(self, layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
        from transformers import DynamicCache

        if layers is None:
            return DynamicCache()
        return DynamicCache(ddp_cache_data=layers)

    @torch.inference_mode()
    def forward(self, ids: list[int], start: int, cache: Any, all_logits: bool = False) -> torch.Tensor:
        """Run ``ids`` at positions ``start..`` on top of ``cache`` (updated in place)."""
        x = torch.tensor([ids], device=self.device)
        pos = torch.arange(start, start + len(ids), device=self.device).unsqueeze(0)
        out = self.model(input_ids=x, position_ids=pos, use_cache=True,
                         logits_to_keep=0 if all_logits else 1, **{self._cache_kw: cache})
        return out.logits[0].float()

    @staticmethod
    def truncate(cache: Any, length: int) -> None:
        # A negative crop removes that many tokens in every transformers version we support.
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)

    @staticmethod
    def stacked_kv(cache: Any, start: int = 0, end: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``cache`` tokens [start, end) as [layers, heads, tokens, dim]."""
        ks = torch.stack([layer.keys[0, :, start:end] for layer in cache.layers])
        vs = torch.stack([layer.values[0, :, start:end] for layer in cache.layers])
        return ks, vs

    @torch.inference_mode()
    def capture(self, ids: list[int], spans: list[tuple[int, int]]) -> list[SegmentKV]:
        """One forward over ``ids`` from position 0; keep the KV of each span."""
        t0 = time.perf_counter()
        cache = self.new_cache()
        self.forward(ids[: max(e for _, e in spans)], 0, cache)
        ks, vs = self.stacked_kv(cache)
        build_s = (time.perf_counter() - t0) / len(spans)
        out = []
        for s, e in spans:
            entry = SegmentKV(ks[:, :, s:e].clone(), vs[:, :, s:e].clone(), start=s, build_s=build_s)
            entry.compute_fingerprint()
            out.append(entry)
        return out

    # ------------------------------------------------------------------ segment stores

    def neutral_entry(self, unit_ids: list[int], unit_hash: str | None = None) -> tuple[SegmentKV, float]:
        """The neutral warm-up KV of one segment unit, built once and then served from the cache.

        Returns the entry and its build time (0.0 on a cache hit).
        """
        # A caller that already holds ids_hash(unit_ids) (a prompt's segment_hashes) passes it, which
        # keeps hashing tens of thousands of ids out of the TTFT path.
        key = SegmentKey(self.fingerprint, unit_hash or ids_hash(unit_ids), self.neutral_hash, "neutral")
        entry = self.cache.get(key)
        if entry is not None:
            return entry, 0.0
        return self._build_neutral(key, unit_ids)

    def _build_neutral(self, key: SegmentKey, unit_ids: list[int]) -> tuple[SegmentKV, float]:
        """Warm one segment unit up after the neutral head and store its KV; (entry, build seconds)."""
        h = len(self.neutral_head)
        (entry,) = self.capture(self.neutral_head + list(unit_ids), [(h, h + len(unit_ids))])
        self.cache.put(key, entry)
        return entry, entry.build_s

    def neutral_entries(self, prompt: Prompt) -> list[tuple[SegmentKV, float]]:
        """Each segment's neutral entry and its build time (0.0: it was already cached).

        Every segment the prompt needs is looked up (and so marked recently used) before any missing
        one is built and stored: a warm-up's eviction never takes a document this same prompt was
        about to hit (the vLLM backend and the simulator look up the same way)."""
        keys = [SegmentKey(self.fingerprint, prompt.segment_hashes[i], self.neutral_hash, "neutral")
                for i in range(len(prompt.spans))]
        held = [self.cache.get(k) for k in keys]
        return [(e, 0.0) if e is not None else self._build_neutral(k, prompt.unit_ids(i))
                for i, (k, e) in enumerate(zip(keys, held))]

    def segment_entries(self, prompt: Prompt, spec: ArmSpec, capture_prompt: Prompt | None
                        ) -> tuple[list[SegmentKV], float, int]:
        """Segment KV for ``prompt`` under ``spec``: (entries, build seconds, tokens already cached)."""
        src = capture_source(spec, prompt, capture_prompt)
        if src is None:  # neutral warm-ups
            built = self.neutral_entries(prompt)
            hit = sum(e.n_tokens for e, b in built if b == 0.0)
            return [e for e, _ in built], sum(b for _, b in built), hit
        entries = self.capture(src.ids, src.spans)
        return entries, sum(e.build_s for e in entries), 0

    # ------------------------------------------------------------------ arms

    @torch.inference_mode()
    def prefill(self, prompt: Prompt, spec: ArmSpec, entries: list[SegmentKV]) -> tuple[Any, torch.Tensor, int]:
        """Prefill ``prompt`` under ``spec``; returns (cache, first-token logits, tokens reused)."""
        cache, logits, reused, _ = self.prefill_detail(prompt, spec, entries)
        return cache, logits, reused

    @torch.inference_mode()
    def prefill_detail(self, prompt: Prompt, spec: ArmSpec, entries: list[SegmentKV]
                       ) -> tuple[Any, torch.Tensor, int, dict[str, Any] | None]:
        """:meth:`prefill`, plus a repair arm's account (None for other arms): the positions it
        recomputed, how many of how many segment tokens, and the seconds its selection and its
        recomputation took (both inside the prefill, so inside TTFT)."""
        cache = self.new_cache()
        if spec.source is None:
            logits = self.forward(prompt.ids, 0, cache)
            return cache, logits[-1], 0, None
        self.forward(prompt.ids[: prompt.head_len], 0, cache)
        head_k, head_v = self.stacked_kv(cache)
        # Assemble in place: the head's KV, then each segment's keys rotated straight into their
        # slice (no per-segment copies and no concatenation pass).
        n_layers, n_heads, h = head_k.shape[:3]
        k_all = head_k.new_empty((n_layers, 1, n_heads, prompt.tail_start, head_k.shape[-1]))
        v_all = head_v.new_empty((n_layers, 1, n_heads, prompt.tail_start, head_v.shape[-1]))
        k_all[:, 0, :, :h] = head_k
        v_all[:, 0, :, :h] = head_v
        for (s, e), entry in zip(prompt.spans, entries):
            delta = s - entry.start if spec.rerotate else 0
            self.rope.rotate(entry.keys, delta, out=k_all[:, 0, :, s:e])
            v_all[:, 0, :, s:e] = entry.values
        cache = self.new_cache([(k_all[i], v_all[i]) for i in range(n_layers)])
        reused = sum(e.n_tokens for e in entries)
        detail = None
        if spec.repair is not None:
            t0 = time.perf_counter()
            chosen = self.select_tokens(prompt, spec, cache)
            t1 = time.perf_counter()
            self.recompute_tokens(prompt, cache, chosen)
            t2 = time.perf_counter()
            reused -= len(chosen)
            seg = prompt.tail_start - prompt.head_len
            detail = {"repair": spec.repair, "param": spec.param, "recomputed": chosen,
                      "n_recomputed": len(chosen), "segment_tokens": seg,
                      "share": len(chosen) / seg if seg else 0.0,
                      "select_s": t1 - t0, "recompute_s": t2 - t1}
        tail = prompt.ids[prompt.tail_start:]
        logits = self.forward(tail, prompt.tail_start, cache)
        return cache, logits[-1], reused, detail

    # ------------------------------------------------------------------ repairs

    def select_tokens(self, prompt: Prompt, spec: ArmSpec, cache: Any) -> list[int]:
        """The segment positions a repair arm recomputes, ascending (:func:`repair_count` of them)."""
        spans = list(prompt.spans)
        k = repair_count(spec, spans)
        if spec.repair == "epic":
            n = int(spec.param or 0)
            return [p for s, e in spans for p in range(s, min(e, s + n))]
        if spec.repair != "blend":
            raise KvauditError(f"unknown repair {spec.repair!r}")
        deviation = self.kv_deviation(prompt, cache)  # always measured: blend@0/1 time it too
        if k <= 0:
            return []
        top = torch.topk(deviation, k).indices + prompt.head_len
        return sorted(int(p) for p in top)

    @torch.inference_mode()
    def kv_deviation(self, prompt: Prompt, cache: Any, layer: int = BLEND_SELECT_LAYER) -> torch.Tensor:
        """Per segment token (prompt order), the squared distance between its KV computed in
        context and the reused KV in ``cache`` at ``layer``, keys and values together: the first
        ``layer + 1`` layers alone are run over the head and segments (CacheBlend's selection)."""
        h, n = prompt.head_len, prompt.tail_start
        fresh = self.new_cache()
        inner = self.model.model
        layers = inner.layers
        inner.layers = layers[: layer + 1]
        try:
            x = torch.tensor([prompt.ids[:n]], device=self.device)
            pos = torch.arange(0, n, device=self.device).unsqueeze(0)
            inner(input_ids=x, position_ids=pos, use_cache=True, **{self._cache_kw: fresh})
        finally:
            inner.layers = layers
        fk, fv = fresh.layers[layer].keys[0, :, h:n], fresh.layers[layer].values[0, :, h:n]
        rk, rv = cache.layers[layer].keys[0, :, h:n], cache.layers[layer].values[0, :, h:n]
        dev = (fk.float() - rk.float()).pow(2).sum(dim=(0, 2)) + (fv.float() - rv.float()).pow(2).sum(dim=(0, 2))
        return dev

    @torch.inference_mode()
    def recompute_tokens(self, prompt: Prompt, cache: Any, positions: list[int]) -> None:
        """Recompute the KV of the tokens at ``positions`` (segment positions, ascending) in every
        layer, in place: one forward of those tokens at their own positions whose attention mask
        lets each see every earlier cached token except the stale entries of ``positions``, and
        the recomputed ones at or before it; their new keys and values then replace the reused
        ones and the cache is cut back to the segment end. No positions: nothing runs."""
        if not positions:
            return
        n = prompt.tail_start
        cached = cache.get_seq_length()
        if cached != n:
            raise KvauditError(f"recompute_tokens: the cache holds {cached} tokens, expected {n}")
        dtype = next(self.model.parameters()).dtype
        pos = torch.tensor(positions, device=self.device)
        chosen = torch.zeros(n, dtype=torch.bool, device=self.device)
        chosen[pos] = True
        key_pos = torch.arange(n, device=self.device)
        see_cached = (key_pos[None, :] <= pos[:, None]) & ~chosen[None, :]
        see_new = pos[None, :] <= pos[:, None]
        allowed = torch.cat([see_cached, see_new], dim=1)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        x = torch.tensor([[prompt.ids[p] for p in positions]], device=self.device)
        self.model(input_ids=x, position_ids=pos.unsqueeze(0), attention_mask=mask[None, None],
                   use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})
        for layer in cache.layers:
            layer.keys[:, :, pos] = layer.keys[:, :, n:]
            layer.values[:, :, pos] = layer.values[:, :, n:]
        self.truncate(cache, n)

    @torch.inference_mode()
    def decode(self, cache: Any, first_logits: torch.Tensor, start: int) -> list[int]:
        out: list[int] = []
        nxt = int(torch.argmax(first_logits))
        pos = start
        for _ in range(self.decoding.max_new_tokens):
            if nxt in self.eos:
                break
            out.append(nxt)
            logits = self.forward([nxt], pos, cache)
            pos += 1
            nxt = int(torch.argmax(logits[-1]))
        return out

    @torch.inference_mode()
    def candidate_logprobs(self, cache: Any, first_logits: torch.Tensor, start: int,
                           candidates: list[str]) -> dict[str, float]:
        """Teacher-forced log-probability of each candidate as the whole answer."""
        self.truncate(cache, start)
        first_lp = torch.log_softmax(first_logits, -1)
        out = {}
        for cand in candidates:
            ids = self.tok.encode(cand)
            lp = float(first_lp[ids[0]])
            if len(ids) > 1:
                logits = self.forward(ids[:-1], start, cache, all_logits=True)
                lps = torch.log_softmax(logits, -1)
                lp += float(sum(lps[i, ids[i + 1]] for i in range(len(ids) - 1)))
                self.truncate(cache, start)
            out[cand] = lp
        return out

    def run_arm(self, prompt: Prompt, spec: ArmSpec, *, capture_prompt: Prompt | None = None,
                candidates: list[str] | None = None) -> ArmOutput:
        hits: list[bool] = []
        if spec.source is None:
            entries, build_s, hit = [], 0.0, 0
        elif spec.repair is not None:  # per-segment hits: recomputed tokens are not cache hits
            built = self.neutral_entries(prompt)
            entries, build_s = [e for e, _ in built], sum(b for _, b in built)
            hits = [b == 0.0 for _, b in built]
            hit = sum(e.n_tokens for e, b in built if b == 0.0)
        else:
            entries, build_s, hit = self.segment_entries(prompt, spec, capture_prompt)
        t0 = time.perf_counter()
        cache, first_logits, reused, detail = self.prefill_detail(prompt, spec, entries)
        top = torch.topk(first_logits, self.decoding.top_k_logits)
        ttft = time.perf_counter() - t0
        if detail is not None:
            recomputed = set(detail["recomputed"])
            hit -= sum(1 for (s, e), was_hit in zip(prompt.spans, hits) if was_hit
                       for p in range(s, e) if p in recomputed)
        t1 = time.perf_counter()
        answer_ids = self.decode(cache, first_logits, len(prompt.ids))
        decode_s = time.perf_counter() - t1
        canary = None
        if candidates:
            canary = self.candidate_logprobs(cache, first_logits, len(prompt.ids), candidates)
        vals = [float(v) for v in top.values]
        result = build_arm_result(
            spec, prompt, self.tok, self.decoding, answer_ids=answer_ids,
            top=list(zip(top.indices.tolist(), vals)), ttft_s=ttft, decode_s=decode_s,
            tokens_reused=reused, cache_hit_tokens=hit,
            fingerprints={sid: e.fingerprint for sid, e in zip(prompt.segment_ids, entries)},
            canary=canary)
        return ArmOutput(result=result, first_logits=first_logits, build_s=build_s, detail=detail)


def open_backend(model: str = "smollm2", *, dtype: str = "float32", device: str = "cpu",
                 threads: int | None = None, max_new_tokens: int = 24,
                 cache_bytes: int = 2 << 30) -> TransformersBackend:
    """The transformers backend's opener (registered as ``transformers`` in :mod:`kvaudit.runners.registry`)."""
    import torch

    from kvaudit.models import load_model

    if threads:
        torch.set_num_threads(threads)
    lm = load_model(model, dtype=dtype, device=device)
    return TransformersBackend(lm.model, lm.tokenizer, lm.fingerprint,
                               decoding=Decoding(max_new_tokens=max_new_tokens),
                               cache_bytes=cache_bytes, device=device)
