"""GPU time to first token: recompute vs segment reuse vs the fresh-token lower bound, at serving scale.

Builds a Llama model from a config with random weights (Llama-3.1-8B's shape by default; speed
does not depend on weight values) in bf16 on the device, makes prompts of 4K to 32K tokens from
random ids (4 documents, a 64-token prefix, a 32-token question) and times, with CUDA events
after warm-up, the same three things as benchmarks/ttft.py on kvaudit's transformers backend:

- recompute: ``prefill`` of every token, then the first token's argmax;
- reuse: segment lookup in the backend's cache (KV built once by the neutral warm-up, not timed),
  ``prefill`` with re-rotation and assembly, then the argmax (the runner's TTFT path);
- lower bound: the same two fresh forwards (head from scratch, tail on a ready cache of the same
  length) with no rotation or assembly.

Every one of the three goes through the backend's own code (``prefill``, ``forward``, its caches
and ``RopeSpec``): none has a prefill of its own. Besides the medians it reports the KV
bytes assembled per request, the achieved bandwidth of the assembly step against a plain
device-to-device copy, and a physical floor (weights read once plus the assembled KV bytes, at
the measured copy bandwidth). The assembly step is timed inside the backend's own ``prefill``
(:class:`MarkedBackend` marks its forwards: assembly is everything between the head forward's
end and the tail forward's start). A second, benchmark-only path
(``StaticReuse``: one preallocated cache, one Triton kernel per segment that rotates keys and
copies values in place, head and tail forwards replayed as CUDA graphs with a GEMM-based attention
for the few fresh queries) shows how much of the remaining time is per-forward overhead; it is
checked against ``prefill`` in float32 (``--check-fp32``). ``--diagnose`` times the attention and
assembly variants in isolation. Results and the closing analysis: benchmarks/RESULTS.md.

Run on a GPU machine from the repository root (no install needed):
    PYTHONPATH=. python3 benchmarks/gpu_ttft.py --json results.json
CPU smoke test of the code paths (tiny model; under a minute, mostly imports):
    .venv/bin/python benchmarks/gpu_ttft.py --device cpu --shape tiny --dtype float32 --contexts 512 --repeats 2
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from kvaudit.core.arms import get_arm
from kvaudit.core.jsonio import ids_hash, write_json
from kvaudit.runners.engines.transformers.backend import TransformersBackend
from kvaudit.runners.prompt import Prompt

SHAPES: dict[str, dict[str, Any]] = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192},
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001),
    "tiny": dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                 rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 1024},
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
}


class StandInTokenizer:
    """Just enough of a tokenizer for the backend's constructor (delimiter and neutral head ids).

    The benchmark builds its prompts from random ids, so nothing else is ever tokenized.
    """

    eos_token_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [int(ids_hash([ord(c) for c in w]), 16) % self.vocab_size for w in text.split()] or [13]}

    def apply_chat_template(self, msgs: list[dict[str, str]], tokenize: bool = False,
                            add_generation_prompt: bool = True) -> str:
        text = "".join(f"<|{m['role']}|> {m['content']} <|end|> " for m in msgs)
        return text + "<|assistant|> "

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def build_model(shape: str, dtype: torch.dtype, device: str, layers: int | None) -> Any:
    import transformers

    cfg = dict(SHAPES[shape])
    if layers:
        cfg["num_hidden_layers"] = layers
    config = transformers.LlamaConfig(**cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    return model.to(dtype).eval()


def make_prompt(n_tokens: int, n_docs: int, prefix: int, question: int, vocab: int, seed: int) -> Prompt:
    """Random ids laid out as [prefix][doc 1]...[doc n][question], spans exact."""
    rng = random.Random(seed)
    ids = [rng.randrange(vocab) for _ in range(n_tokens)]
    doc_total = n_tokens - prefix - question
    sizes = [doc_total // n_docs + (1 if k < doc_total % n_docs else 0) for k in range(n_docs)]
    spans, s = [], prefix
    for n in sizes:
        spans.append((s, s + n))
        s += n
    return Prompt(ids=ids, head_len=prefix, spans=spans, segment_ids=[f"doc{k}" for k in range(n_docs)],
                  segment_hashes=[ids_hash(ids[a:b]) for a, b in spans], ids_hash=ids_hash(ids))


class MarkedBackend(TransformersBackend):
    """The transformers backend itself, marking the start and end of each ``forward`` while
    ``marks`` is a list (CUDA events on a GPU, plus ``perf_counter`` always), so a phase inside its
    own ``prefill`` can be timed without a copy of that code. With ``marks`` None it is unchanged."""

    marks: list[tuple[Any, float]] | None = None

    def _mark(self) -> None:
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.marks.append((event, time.perf_counter()))

    def forward(self, ids: list[int], start: int, cache: Any, all_logits: bool = False) -> torch.Tensor:
        if self.marks is None:
            return super().forward(ids, start, cache, all_logits)
        self._mark()
        out = super().forward(ids, start, cache, all_logits)
        self._mark()
        return out


class Timer:
    """Medians of a callable's duration: CUDA events on a GPU (plus wall clock), wall clock on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def between_forwards(self, be: MarkedBackend, fn: Callable[[], Any], first: int, repeats: int,
                         warmup: int = 1) -> dict[str, float]:
        """Medians of the time from the end of ``be``'s forward number ``first`` to the start of the
        next one, inside one call of ``fn`` (a ``prefill``): the work the backend does between them."""
        for _ in range(warmup):
            fn()
        ev, wall = [], []
        for _ in range(repeats):
            self.sync()
            be.marks = []
            try:
                fn()
                self.sync()
                (end, end_t), (nxt, nxt_t) = be.marks[2 * first + 1], be.marks[2 * first + 2]
            finally:
                be.marks = None
            if self.cuda:
                ev.append(end.elapsed_time(nxt) / 1e3)
            wall.append(nxt_t - end_t)
        med_wall = statistics.median(wall)
        return {"s": statistics.median(ev) if ev else med_wall, "wall_s": med_wall,
                "min_s": min(ev or wall), "max_s": max(ev or wall), "n": repeats}

    def __call__(self, fn: Callable[[], Any], repeats: int, warmup: int = 1) -> dict[str, float]:
        for _ in range(warmup):
            fn()
        ev, wall = [], []
        for _ in range(repeats):
            self.sync()
            t0 = time.perf_counter()
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
            fn()
            if self.cuda:
                b.record()
                b.synchronize()
                ev.append(a.elapsed_time(b) / 1e3)
            self.sync()
            wall.append(time.perf_counter() - t0)
        med_wall = statistics.median(wall)
        return {"s": statistics.median(ev) if ev else med_wall, "wall_s": med_wall,
                "min_s": min(ev or wall), "max_s": max(ev or wall), "n": repeats}


def copy_bandwidth(device: torch.device, timer: Timer, nbytes: int) -> dict[str, float]:
    """A plain device-to-device copy; bandwidth counts bytes read plus bytes written."""
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src), repeats=20, warmup=3)
    return {"bytes_copied": nbytes, "s": t["s"], "bytes_per_s": 2 * nbytes / t["s"]}


# ---------------------------------------------------------------------- benchmark-only fast path

GROUPED = "kvaudit_grouped"


def _bmm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with float32 output; bf16/fp16 operands stay on the tensor cores where torch allows."""
    if a.dtype == torch.float32:
        return torch.bmm(a, b)
    try:
        return torch.bmm(a, b, out_dtype=torch.float32)
    except (RuntimeError, TypeError):
        return torch.bmm(a.float(), b.float())


def grouped_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention of a few fresh queries over a long cache, registered as a transformers attention.

    ``attention_mask`` is an additive float32 bias [1, 1, queries, keys]; only the first ``keys``
    cache rows are read. Each KV head's query group is folded into the rows of one batched GEMM
    (no repeat of K and V), scores and softmax stay in float32, and every GEMM has the whole key
    length to spread over the chip, where SDPA with a mask runs one block per head.
    """
    _, hq, t, d = query.shape
    hk, n = key.shape[1], attention_mask.shape[-1]
    scores = _bmm_f32(query[0].reshape(hk, hq // hk * t, d), key[0, :, :n].transpose(1, 2))
    scores.mul_(scaling if scaling is not None else d ** -0.5)
    scores.view(hk, hq // hk, t, n).add_(attention_mask[0, 0])
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.bmm(probs, value[0, :, :n])
    return out.view(1, hq, t, d).transpose(1, 2).contiguous(), None


class using_attention:
    """Run the model's attention layers with a registered implementation for a while."""

    def __init__(self, model: Any, name: str | None):
        self.model, self.name = model, name

    def __enter__(self) -> None:
        self.old = self.model.config._attn_implementation
        if self.name:
            self.model.config._attn_implementation = self.name

    def __exit__(self, *exc: object) -> None:
        self.model.config._attn_implementation = self.old


def triton_assembler() -> Callable:
    """One kernel per segment: keys rotated (float32 math) and values copied into the cache slice."""
    import triton
    import triton.language as tl

    @triton.jit
    def _assemble(k_src, v_src, k_dst, v_dst, cos, sin, n_rows, n_tok, dst_stride,
                  HALF: tl.constexpr, BLOCK: tl.constexpr):
        rows = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
        live = (rows < n_rows)[:, None]
        cols = tl.arange(0, HALF)[None, :]
        src = rows[:, None] * (2 * HALF) + cols
        dst = (rows // n_tok)[:, None] * dst_stride + (rows % n_tok)[:, None] * (2 * HALF) + cols
        x1 = tl.load(k_src + src, mask=live).to(tl.float32)
        x2 = tl.load(k_src + src + HALF, mask=live).to(tl.float32)
        c = tl.load(cos + cols)
        s = tl.load(sin + cols)
        tl.store(k_dst + dst, (x1 * c - x2 * s).to(k_dst.dtype.element_ty), mask=live)
        tl.store(k_dst + dst + HALF, (x2 * c + x1 * s).to(k_dst.dtype.element_ty), mask=live)
        tl.store(v_dst + dst, tl.load(v_src + src, mask=live), mask=live)
        tl.store(v_dst + dst + HALF, tl.load(v_src + src + HALF, mask=live), mask=live)

    def run(k_dst: torch.Tensor, v_dst: torch.Tensor, k_src: torch.Tensor, v_src: torch.Tensor,
            cos: torch.Tensor, sin: torch.Tensor) -> None:
        layers, heads, n, d = k_src.shape
        st = k_dst.stride()
        if not (k_src.is_contiguous() and v_src.is_contiguous() and st == v_dst.stride()
                and st[0] == heads * st[1] and st[2] == d and st[3] == 1 and v_src.shape == k_src.shape):
            raise ValueError("unexpected KV layout for the assembly kernel")
        rows, block = layers * heads * n, 32
        _assemble[(triton.cdiv(rows, block),)](k_src, v_src, k_dst, v_dst, cos, sin, rows, n, st[1],
                                                HALF=d // 2, BLOCK=block, num_warps=4)

    return run


class StaticReuse:
    """Reuse prefill on one preallocated cache, with the fresh-token forwards replayed as CUDA graphs.

    Benchmark-only (the runner does not use it). Same inputs as ``TransformersBackend.prefill``
    for a reuse arm, same first-token logits up to rounding (checked in float32 by
    ``--check-fp32``). The KV of all layers lives in two [layers, 1, kv_heads, max_len, head_dim]
    buffers that transformers' ``StaticCache`` layers view, so assembly is one kernel per segment
    (``triton_assembler``), and each fresh forward is a graph per (token count, start position),
    the way serving engines capture graphs per shape bucket. ``attention`` picks the fresh
    forwards' attention: ``grouped_attention`` or transformers' SDPA with a boolean mask.
    """

    @torch.inference_mode()
    def __init__(self, be: TransformersBackend, max_len: int, *, graphs: bool, attention: str,
                 assembler: Callable | None):
        from transformers import StaticCache

        self.be, self.model = be, be.model
        cfg = self.model.config
        dev = be.device
        dtype = next(self.model.parameters()).dtype
        n_kv = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
        self.max_len = max_len
        self.k = torch.zeros((cfg.num_hidden_layers, 1, n_kv, max_len, be.rope.head_dim), dtype=dtype, device=dev)
        self.v = torch.zeros_like(self.k)
        self.cache = StaticCache(config=cfg, max_cache_len=max_len)
        for i, layer in enumerate(self.cache.layers):
            layer.lazy_initialization(self.k[i, :, :, :1], self.v[i, :, :, :1])
            layer.keys, layer.values = self.k[i], self.v[i]
        self.kv_arange = torch.arange(max_len, device=dev)
        self.graphs = graphs and dev.type == "cuda"
        self.attention = attention
        if attention == "grouped":
            from transformers import AttentionInterface

            AttentionInterface.register(GROUPED, grouped_attention)
        self.assembler = assembler
        self._static: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._graphs: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}

    def _body(self, n: int, start: int) -> torch.Tensor:
        ids, start_t = self._static[n]
        pos = self.kv_arange[:n].unsqueeze(0) + start_t
        for layer in self.cache.layers:
            layer.cumulative_length.copy_(start_t)
        # An explicit 4-D mask keeps transformers from deriving one from the cache (a host sync);
        # the grouped attention reads only the first `keys` cache rows.
        keys = min(self.max_len, -(-(start + n) // 64) * 64)
        allowed = self.kv_arange[None, :keys] <= pos[0, :, None]
        if self.attention == "grouped":
            mask = torch.zeros(allowed.shape, device=allowed.device).masked_fill_(~allowed, float("-inf"))
        else:
            mask = (self.kv_arange[None, :] <= pos[0, :, None])
        with using_attention(self.model, GROUPED if self.attention == "grouped" else None):
            out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask[None, None], use_cache=True,
                             logits_to_keep=1, **{self.be._cache_kw: self.cache})
        return out.logits[0, -1]

    def fresh(self, ids: list[int], start: int) -> torch.Tensor:
        """Last-token logits of ``ids`` at positions start.. on top of the cache (KV written in place)."""
        n = len(ids)
        if n not in self._static:
            self._static[n] = (torch.zeros((1, n), dtype=torch.long, device=self.be.device),
                               torch.zeros((), dtype=torch.long, device=self.be.device))
        sid, sstart = self._static[n]
        sid.copy_(torch.tensor(ids, dtype=torch.long).view(1, n), non_blocking=True)
        sstart.fill_(start)
        if not self.graphs:
            return self._body(n, start)
        if (n, start) not in self._graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._body(n, start)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._body(n, start)
            self._graphs[(n, start)] = (graph, out)
        graph, out = self._graphs[(n, start)]
        graph.replay()
        return out

    @torch.inference_mode()
    def assemble(self, prompt: Prompt, entries: list[Any]) -> None:
        half = self.be.rope.head_dim // 2
        for (s, e), entry in zip(prompt.spans, entries):
            delta = s - entry.start
            k_dst, v_dst = self.k[:, 0, :, s:e], self.v[:, 0, :, s:e]
            if self.assembler is None:
                self.be.rope.rotate(entry.keys, delta, out=k_dst)
                v_dst.copy_(entry.values)
            else:
                self.assembler(k_dst, v_dst, entry.keys, entry.values, *half_cos_sin(self.be, delta, half))

    @torch.inference_mode()
    def prefill(self, prompt: Prompt, entries: list[Any]) -> torch.Tensor:
        self.fresh(prompt.ids[: prompt.head_len], 0)
        self.assemble(prompt, entries)
        return self.fresh(prompt.ids[prompt.tail_start:], prompt.tail_start)

    @torch.inference_mode()
    def lower_bound(self, prompt: Prompt) -> torch.Tensor:
        self.fresh(prompt.ids[: prompt.head_len], 0)
        return self.fresh(prompt.ids[prompt.tail_start:], prompt.tail_start)


def half_cos_sin(be: TransformersBackend, delta: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation's cos and sin for a shift of ``delta`` positions, first half (the kernel's
    layout), from the backend's own :meth:`RopeSpec.cos_sin` (float64 angle, float32 values)."""
    cos, sin = be.rope.cos_sin(delta, be.device, torch.float32)
    return cos[:half].contiguous(), sin[:half].contiguous()


def pick_assembler(be: TransformersBackend, want: str) -> tuple[Callable | None, str]:
    """The Triton assembly kernel if it runs and matches the eager rotation, else None (eager)."""
    if want != "triton" or be.device.type != "cuda":
        return None, "eager"
    try:
        fn = triton_assembler()
        dtype = next(be.model.parameters()).dtype
        src_k = torch.randn(3, 2, 40, be.rope.head_dim, device=be.device).to(dtype)
        src_v = torch.randn_like(src_k)
        got_k = torch.zeros(3, 2, 50, src_k.shape[-1], dtype=dtype, device=be.device)
        got_v = torch.zeros_like(got_k)
        fn(got_k[:, :, 5:45], got_v[:, :, 5:45], src_k, src_v, *half_cos_sin(be, 1234, be.rope.head_dim // 2))
        want_k = be.rope.rotate(src_k, 1234)
        err = rel_err(got_k[:, :, 5:45], want_k)
        if err > 1e-2 or not torch.equal(got_v[:, :, 5:45], src_v) or got_k[:, :, :5].abs().sum() != 0:
            raise RuntimeError(f"assembly kernel disagrees with the eager rotation (rel err {err:.2e})")
        return fn, f"triton (rel err vs eager {err:.1e})"
    except Exception as exc:  # noqa: BLE001 - any kernel failure means: use the eager assembly
        print(f"Triton assembly unavailable ({type(exc).__name__}: {str(exc)[:300]}); using eager", flush=True)
        return None, "eager"


# ---------------------------------------------------------------------- measurement

def kv_bytes_per_token(model: Any) -> int:
    cfg = model.config
    n_kv = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * n_kv * head_dim * next(model.parameters()).element_size()


def weight_bytes_read(model: Any) -> int:
    """Parameter bytes a forward reads once (the input embedding is gathered, not read)."""
    emb = model.model.embed_tokens.weight
    return sum(p.numel() * p.element_size() for p in model.parameters()) - emb.numel() * emb.element_size()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def measure_context(be: MarkedBackend, timer: Timer, n_ctx: int, args: argparse.Namespace,
                    copy_bw: float, assembler: Callable | None) -> dict[str, Any]:
    model = be.model
    prompt = make_prompt(n_ctx, args.docs, args.prefix, args.question, model.config.vocab_size, seed=n_ctx)
    reuse = get_arm("reuse")
    t0 = time.perf_counter()
    entries = be.segment_entries(prompt, reuse, None)[0]  # one-time neutral warm-up, not timed below
    timer.sync()
    build_s = time.perf_counter() - t0
    seg_tokens = sum(e.n_tokens for e in entries)
    bpt = kv_bytes_per_token(model)
    kv_bytes = seg_tokens * bpt

    def recompute() -> int:
        _, logits, _ = be.prefill(prompt, get_arm("recompute"), [])
        return int(torch.argmax(logits))

    def reused() -> int:
        es = be.segment_entries(prompt, reuse, None)[0]
        _, logits, _ = be.prefill(prompt, reuse, es)
        return int(torch.argmax(logits))

    # A ready cache of the same length for the lower bound (content does not change its speed).
    cache, reuse_logits, _ = be.prefill(prompt, reuse, entries)
    ready_k, ready_v = be.stacked_kv(cache, 0, prompt.tail_start)
    ready_k, ready_v = ready_k.unsqueeze(1), ready_v.unsqueeze(1)
    del cache

    def lower_bound() -> int:
        head = be.new_cache()
        be.forward(prompt.ids[: prompt.head_len], 0, head)
        c = be.new_cache([(ready_k[i], ready_v[i]) for i in range(ready_k.shape[0])])
        logits = be.forward(prompt.ids[prompt.tail_start:], prompt.tail_start, c)
        return int(torch.argmax(logits[-1]))

    # The assembly step inside the backend's own prefill: from the head forward's end to the tail
    # forward's start (the head's KV gathered, the segments' keys rotated into place, values copied).
    def assembled_prefill() -> None:
        be.prefill(prompt, reuse, entries)

    row: dict[str, Any] = {"context": n_ctx, "prompt_tokens": len(prompt.ids), "docs": len(entries),
                           "segment_tokens": seg_tokens, "fresh_tokens": len(prompt.ids) - seg_tokens,
                           "kv_bytes_assembled": kv_bytes, "one_time_caching_s": build_s}
    row["recompute"] = timer(recompute, args.recompute_repeats, warmup=1)
    row["reuse"] = timer(reused, args.repeats, warmup=2)
    row["lower_bound"] = timer(lower_bound, args.repeats, warmup=2)
    row["assembly"] = timer.between_forwards(be, assembled_prefill, 0, args.repeats, warmup=2)
    row["assembly"]["bytes_per_s"] = 2 * kv_bytes / row["assembly"]["s"]
    row["assembly"]["fraction_of_copy_bw"] = row["assembly"]["bytes_per_s"] / copy_bw
    row["lookup"] = timer(lambda: be.segment_entries(prompt, reuse, None), args.repeats, warmup=1)
    row["floor_s"] = (weight_bytes_read(model) + kv_bytes) / copy_bw

    if args.fast:
        try:
            fast = StaticReuse(be, -(-len(prompt.ids) // 256) * 256, graphs=args.graphs,
                               attention=args.attention, assembler=assembler)

            def fast_reuse() -> int:
                es = be.segment_entries(prompt, reuse, None)[0]
                return int(torch.argmax(fast.prefill(prompt, es)))

            def fast_bound() -> int:
                return int(torch.argmax(fast.lower_bound(prompt)))

            fast_logits = fast.prefill(prompt, entries).float().clone()
            row["fast_check"] = {"rel_err_vs_reuse": rel_err(fast_logits, reuse_logits),
                                 "max_abs_diff": float((fast_logits - reuse_logits).abs().max()),
                                 "same_argmax": bool(torch.argmax(fast_logits) == torch.argmax(reuse_logits))}
            row["fast_reuse"] = timer(fast_reuse, args.repeats, warmup=2)
            row["fast_lower_bound"] = timer(fast_bound, args.repeats, warmup=2)
            row["fast_assembly"] = timer(lambda: fast.assemble(prompt, entries), args.repeats, warmup=2)
            row["fast_assembly"]["bytes_per_s"] = 2 * kv_bytes / row["fast_assembly"]["s"]
            row["fast_assembly"]["fraction_of_copy_bw"] = row["fast_assembly"]["bytes_per_s"] / copy_bw
            row["fast_graphs"] = fast.graphs
        except Exception:  # noqa: BLE001 - report and keep the main measurements
            row["fast_error"] = traceback.format_exc(limit=6)
            print(row["fast_error"], file=sys.stderr, flush=True)
    return row


def check_fp32(args: argparse.Namespace, assembler_kind: str) -> dict[str, Any]:
    """Static path vs ``prefill`` in float32 on a 2-layer model: differences here are bugs, not rounding."""
    model = build_model(args.shape, torch.float32, args.device, 2)
    be = TransformersBackend(model, StandInTokenizer(model.config.vocab_size), "fp32-check",
                             cache_bytes=1 << 50, device=args.device)
    n = 4096 if be.device.type == "cuda" else 512
    prompt = make_prompt(n, args.docs, args.prefix, args.question, model.config.vocab_size, seed=7)
    entries = be.segment_entries(prompt, get_arm("reuse"), None)[0]
    _, want, _ = be.prefill(prompt, get_arm("reuse"), entries)
    assembler, name = pick_assembler(be, assembler_kind)
    fast = StaticReuse(be, n, graphs=args.graphs, attention=args.attention, assembler=assembler)
    got = fast.prefill(prompt, entries).float()
    again = fast.prefill(prompt, entries).float()  # a graph replay, not the capture
    return {"tokens": n, "assembly": name, "rel_err": rel_err(got, want), "rel_err_replay": rel_err(again, want),
            "max_abs_diff": float((again - want).abs().max()), "logit_scale": float(want.abs().max())}


def diagnose(be: TransformersBackend, timer: Timer, n_ctx: int, args: argparse.Namespace,
             assembler: Callable | None, copy_bw: float) -> dict[str, Any]:
    """Per-layer attention of the fresh tail over ``n_ctx`` keys, and assembly variants, in isolation."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers.integrations.sdpa_attention import repeat_kv

    cfg, dev = be.model.config, be.device
    dtype = next(be.model.parameters()).dtype
    hq, hk, d, t = cfg.num_attention_heads, cfg.num_key_value_heads, be.rope.head_dim, args.question
    q = torch.randn(1, hq, t, d, device=dev, dtype=dtype)
    k, v = (torch.randn(1, hk, n_ctx, d, device=dev, dtype=dtype) for _ in range(2))
    allowed = torch.arange(n_ctx, device=dev)[None, :] <= torch.arange(n_ctx - t, n_ctx, device=dev)[:, None]
    bias = torch.zeros(allowed.shape, device=dev).masked_fill_(~allowed, float("-inf"))[None, None]
    out: dict[str, Any] = {"context": n_ctx, "kv_bytes_per_layer": 2 * k.numel() * k.element_size()}
    out["attention_floor_s"] = out["kv_bytes_per_layer"] / copy_bw

    def masked_sdpa() -> torch.Tensor:  # what transformers' sdpa path does for a tail on a cache
        return torch.nn.functional.scaled_dot_product_attention(
            q, repeat_kv(k, hq // hk), repeat_kv(v, hq // hk), attn_mask=allowed[None, None])

    with torch.inference_mode():
        ref = grouped_attention(None, q, k, v, bias)[0].transpose(1, 2)
        for label, backend in (("sdpa_masked_default", None), ("sdpa_masked_efficient", SDPBackend.EFFICIENT_ATTENTION),
                               ("sdpa_masked_math", SDPBackend.MATH)):
            try:
                if backend is None:
                    out[label] = timer(masked_sdpa, 10, warmup=2)
                else:
                    with sdpa_kernel(backend):
                        out[label] = timer(masked_sdpa, 10, warmup=2)
                        out[label]["rel_err_vs_grouped"] = rel_err(masked_sdpa(), ref)
            except Exception as exc:  # noqa: BLE001 - a backend that refuses the inputs is a finding
                out[label] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out["grouped"] = timer(lambda: grouped_attention(None, q, k, v, bias), 10, warmup=2)

        layers = cfg.num_hidden_layers
        src_k, src_v = (torch.randn(layers, hk, n_ctx, d, device=dev, dtype=dtype) for _ in range(2))
        dst_k, dst_v = (torch.zeros(layers, 1, hk, n_ctx + 256, d, device=dev, dtype=dtype) for _ in range(2))
        sk, sv = dst_k[:, 0, :, 64:64 + n_ctx], dst_v[:, 0, :, 64:64 + n_ctx]
        nbytes = 2 * src_k.numel() * src_k.element_size()
        cs = half_cos_sin(be, 4321, d // 2)
        variants: dict[str, Callable[[], Any]] = {
            "eager_rotate_and_copy": lambda: (be.rope.rotate(src_k, 4321, out=sk), sv.copy_(src_v)),
            "values_strided_copy_only": lambda: sv.copy_(src_v),
            "keys_and_values_contiguous_copy": lambda: (src_k.clone(), src_v.clone()),
        }
        if assembler is not None:
            variants["triton_assembly"] = lambda: assembler(sk, sv, src_k, src_v, *cs)
        for label, fn in variants.items():
            r = timer(fn, 10, warmup=2)
            moved = nbytes if label != "values_strided_copy_only" else nbytes // 2
            r["bytes_per_s"] = 2 * moved / r["s"]
            r["fraction_of_copy_bw"] = r["bytes_per_s"] / copy_bw
            out[label] = r
    return out


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "python": platform.python_version(), "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                   cuda=torch.version.cuda)
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            env["nvidia_smi"] = q.stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            env["nvidia_smi"] = f"unavailable: {exc}"
    return env


def fmt_ms(t: dict[str, float] | None) -> str:
    return "-" if t is None else f"{t['s'] * 1e3:.1f}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\n| context | recompute ms | reuse ms | lower bound ms | floor ms | recompute/reuse | reuse/bound "
          "| KV assembled GB | assembly ms | assembly GB/s (% copy) "
          "| graphed reuse ms | graphed bound ms | recompute/graphed | graphed reuse/bound |")
    print("|" + "---:|" * 14)
    for r in rows:
        re, ru, lb = r["recompute"]["s"], r["reuse"]["s"], r["lower_bound"]["s"]
        a = r["assembly"]
        fr, fb = r.get("fast_reuse"), r.get("fast_lower_bound")
        fast = (f"{fmt_ms(fr)} | {fmt_ms(fb)} | {re / fr['s']:.1f}x | {fr['s'] / fb['s']:.2f}"
                if fr and fb else "- | - | - | -")
        print(f"| {r['prompt_tokens']} | {re * 1e3:.1f} | {ru * 1e3:.1f} | {lb * 1e3:.1f} | {r['floor_s'] * 1e3:.1f} "
              f"| {re / ru:.1f}x | {ru / lb:.2f} | {r['kv_bytes_assembled'] / 1e9:.2f} | {a['s'] * 1e3:.2f} "
              f"| {a['bytes_per_s'] / 1e9:.0f} ({100 * a['fraction_of_copy_bw']:.0f}%) | {fast} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="override the number of layers")
    ap.add_argument("--contexts", default="4096,8192,16384,32768")
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--prefix", type=int, default=64)
    ap.add_argument("--question", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--recompute-repeats", type=int, default=5)
    ap.add_argument("--copy-gib", type=float, default=4.0, help="size of the copy-bandwidth probe")
    ap.add_argument("--fast", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the benchmark-only static-cache path")
    ap.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="replay the static path's fresh forwards as CUDA graphs")
    ap.add_argument("--attention", default="grouped", choices=["grouped", "sdpa"],
                    help="the static path's attention for the fresh tokens")
    ap.add_argument("--assembly", default="triton", choices=["triton", "eager"],
                    help="the static path's assembly: one Triton kernel per segment, or RopeSpec.rotate + copy")
    ap.add_argument("--check-fp32", action=argparse.BooleanOptionalAction, default=True,
                    help="check the static path against prefill in float32 on a 2-layer model")
    ap.add_argument("--diagnose", action=argparse.BooleanOptionalAction, default=True,
                    help="time attention kernels and assembly variants at the largest context")
    ap.add_argument("--json", default=None, help="write every measurement here")
    args = ap.parse_args()

    try:
        contexts = [int(c) for c in args.contexts.split(",")]
    except ValueError:
        ap.error(f"--contexts: expected comma-separated token counts, got {args.contexts!r}")
    smallest = args.prefix + args.question + 16 * args.docs
    if args.docs < 1 or args.prefix < 1 or args.question < 1 or min(contexts) < smallest:
        ap.error(f"--contexts: each context needs at least {smallest} tokens for {args.docs} documents, "
                 f"a {args.prefix}-token prefix and a {args.question}-token question")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device is visible to torch", file=sys.stderr)
        return 2
    timer = Timer(device)
    env = environment(device)
    print(env, flush=True)
    t0 = time.perf_counter()
    model = build_model(args.shape, getattr(torch, args.dtype), args.device, args.layers)
    be = MarkedBackend(model, StandInTokenizer(model.config.vocab_size), f"random-{args.shape}",
                       cache_bytes=1 << 50, device=args.device)
    timer.sync()
    print(f"model {args.shape} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params, "
          f"{weight_bytes_read(model) / 1e9:.1f} GB read per forward) built in {time.perf_counter() - t0:.1f}s; "
          f"KV {kv_bytes_per_token(model)} bytes/token", flush=True)
    nbytes = int(args.copy_gib * 2**30) if device.type == "cuda" else 1 << 26
    copy = copy_bandwidth(device, timer, nbytes)
    print(f"device copy: {copy['bytes_per_s'] / 1e12:.2f} TB/s (read + write, {nbytes / 2**30:.1f} GiB)", flush=True)
    assembler, assembler_name = pick_assembler(be, args.assembly) if args.fast else (None, "-")
    print(f"static path: attention {args.attention}, assembly {assembler_name}, graphs {args.graphs}", flush=True)

    rows = []
    for n in contexts:
        row = measure_context(be, timer, n, args, copy["bytes_per_s"], assembler)
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # this context's buffers are gone with measure_context's frame
        fr = row.get("fast_reuse")
        print(f"{n:>6}: recompute {fmt_ms(row['recompute'])} ms, reuse {fmt_ms(row['reuse'])} ms "
              f"(lookup {fmt_ms(row['lookup'])}, assembly {fmt_ms(row['assembly'])}), bound "
              f"{fmt_ms(row['lower_bound'])} ms, floor {row['floor_s'] * 1e3:.1f} ms; graphed reuse "
              f"{fmt_ms(fr)} ms, bound {fmt_ms(row.get('fast_lower_bound'))} ms, check {row.get('fast_check')}",
              flush=True)
    print_table(rows)
    result = {"environment": env, "args": vars(args), "copy": copy, "static_assembly": assembler_name,
              "weight_bytes_read": weight_bytes_read(model), "kv_bytes_per_token": kv_bytes_per_token(model),
              "rows": rows}
    if args.diagnose and device.type == "cuda":
        try:
            result["diagnose"] = diagnose(be, timer, max(r["prompt_tokens"] for r in rows), args, assembler,
                                          copy["bytes_per_s"])
        except Exception:  # noqa: BLE001 - diagnostics must not cost the main table
            result["diagnose"] = traceback.format_exc(limit=6)
        print("\ndiagnose:", result["diagnose"], flush=True)
    if args.check_fp32 and args.fast:
        del be, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            result["check_fp32"] = check_fp32(args, args.assembly)
        except Exception:  # noqa: BLE001
            result["check_fp32"] = traceback.format_exc(limit=8)
        print("\nfloat32 check of the static path:", result["check_fp32"], flush=True)
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
