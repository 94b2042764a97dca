"""vLLM's CUDA paged KV layout (FLASH_ATTN, TRITON_ATTN) and the fused Triton load into it.

Both backends hand each layer over as a logical ``[blocks, kv_heads, block_size, 2 * head_dim]``
tensor and read it as ``kv.transpose(1, 2).split(head_dim, -1)``: key and value caches of shape
``[blocks, block_size, kv_heads, head_dim]`` (physically NHD or HND; only the strides differ).
:class:`PagedKV` records each layer's offset from the first layer's storage and those strides
once, so one kernel can address every layer.

:meth:`PagedKV.load` writes any number of store entries (``[layers, tokens, kv_heads, head_dim]``,
see :mod:`kvaudit.runners.engines.vllm.store`) into the request blocks they belong to, keys rotated by
each entry's own position shift, in **one** Triton launch over (entry, token tile, layer): the
host builds one small descriptor tensor and one cos/sin table, nothing loops over blocks or
layers in Python. The rotation matches :meth:`kvaudit.runners.rope.RopeSpec.rotate` (angle in
float64 on the host, products in float32, one rounding on store); a shift of 0 copies bits.
:meth:`PagedKV.gather` is the reverse (paged cache to a new entry), one launch per entry.

``impl="torch"`` is a plain-torch reference of the same two functions (per layer), used by the
tests on the CPU and to check the kernel on the GPU. The CPU build of vLLM has its own layout
(:class:`kvaudit.runners.engines.vllm.connector.CpuLayout`) and never comes here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from kvaudit.runners.rope import RopeSpec

DESC = 8  # int64 fields per piece: k_off, v_off, layer_stride, src_tok0, n, dst_pos0, bt_off, unused
TOKENS_PER_PROGRAM = 8  # tokens per program of the gather kernel
# The load kernel's tile: 2 tokens x 2 warps ran at 1.39x a plain copy of the same bytes on the H200
# at 32K tokens against 1.69x for 8 x 4 (benchmarks/paged_load.py; larger tiles spill registers).
LOAD_TOKENS_PER_PROGRAM = 2
LOAD_WARPS = 2


@dataclass
class Piece:
    """Tokens [src_tok0, src_tok0 + n) of one entry, written at request positions dst_pos0.. of
    the request whose block table is ``block_ids``; keys rotated by ``delta`` positions."""

    keys: torch.Tensor  # [layers, tokens, kv_heads, head_dim], contiguous
    values: torch.Tensor
    src_tok0: int
    n: int
    dst_pos0: int
    delta: int
    block_ids: list[int]


def _next_pow2(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


@functools.cache
def _kernels() -> tuple[Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def load_kernel(base, meta, trig, layer_off, n_pieces, stride_b, stride_n, stride_h, v_off,
                    BS: tl.constexpr, H: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                    CP: tl.constexpr, BT: tl.constexpr):
        p = tl.program_id(0)
        chunk = tl.program_id(1)
        layer = tl.program_id(2)
        d = meta + p * 8
        k_off = tl.load(d)
        v_src = tl.load(d + 1)
        layer_stride = tl.load(d + 2)
        src0 = tl.load(d + 3)
        n = tl.load(d + 4)
        pos0 = tl.load(d + 5)
        bt = meta + n_pieces * 8 + tl.load(d + 6)
        t = chunk * BT + tl.arange(0, BT)
        live_t = t < n
        pos = pos0 + t
        blk = tl.load(bt + pos // BS, mask=live_t, other=0)
        dst_row = tl.load(layer_off + layer) + blk * stride_b + (pos % BS) * stride_n  # [BT]
        src_row = layer * layer_stride + (src0 + t) * (H * D)  # [BT]
        c = tl.arange(0, CP)
        live_c = c < H * HALF
        head = c // HALF
        j = c % HALF
        src_col = head * D + j
        dst_col = head * stride_h + j
        live = live_t[:, None] & live_c[None, :]
        cos = tl.load(trig + p * 2 * HALF + j, mask=live_c, other=1.0)[None, :]
        sin = tl.load(trig + p * 2 * HALF + HALF + j, mask=live_c, other=0.0)[None, :]
        src = src_row[:, None] + src_col[None, :]
        dst = dst_row[:, None] + dst_col[None, :]
        x1 = tl.load(base + k_off + src, mask=live).to(tl.float32)
        x2 = tl.load(base + k_off + src + HALF, mask=live).to(tl.float32)
        v1 = tl.load(base + v_src + src, mask=live)
        v2 = tl.load(base + v_src + src + HALF, mask=live)
        ty = base.dtype.element_ty
        tl.store(base + dst, (x1 * cos - x2 * sin).to(ty), mask=live)
        tl.store(base + dst + HALF, (x2 * cos + x1 * sin).to(ty), mask=live)
        tl.store(base + v_off + dst, v1, mask=live)
        tl.store(base + v_off + dst + HALF, v2, mask=live)

    @triton.jit
    def gather_kernel(base, bt, layer_off, k_dst, v_dst, n, pos0, stride_b, stride_n, stride_h, v_off,
                      BS: tl.constexpr, H: tl.constexpr, D: tl.constexpr, CP: tl.constexpr,
                      BT: tl.constexpr):
        chunk = tl.program_id(0)
        layer = tl.program_id(1)
        t = chunk * BT + tl.arange(0, BT)
        live_t = t < n
        pos = pos0 + t
        blk = tl.load(bt + pos // BS, mask=live_t, other=0)
        src_row = tl.load(layer_off + layer) + blk * stride_b + (pos % BS) * stride_n
        c = tl.arange(0, CP)
        live_c = c < H * D
        src = src_row[:, None] + ((c // D) * stride_h + c % D)[None, :]
        dst = (layer.to(tl.int64) * n + t)[:, None] * (H * D) + c[None, :]
        live = live_t[:, None] & live_c[None, :]
        tl.store(k_dst + dst, tl.load(base + src, mask=live), mask=live)
        tl.store(v_dst + dst, tl.load(base + v_off + src, mask=live), mask=live)

    return load_kernel, gather_kernel


class PagedKV:
    """The CUDA paged layout over vLLM's per-layer KV tensors (see the module docstring)."""

    name = "cuda_paged"

    def __init__(self, layer_kvs: list[torch.Tensor], head_dim: int, rope: RopeSpec, *, impl: str = "triton"):
        if impl not in ("triton", "torch"):
            raise ValueError(f"impl must be 'triton' or 'torch', got {impl!r}")
        self.impl, self.head_dim, self.rope = impl, head_dim, rope
        self.layer_kvs = layer_kvs
        views = [kv.transpose(1, 2).split(head_dim, dim=-1) for kv in layer_kvs]
        self.k_views = [k for k, _ in views]
        self.v_views = [v for _, v in views]
        k0, v0 = views[0]
        self.base = layer_kvs[0]
        self.dtype, self.device = k0.dtype, k0.device
        self.blocks, self.block_size, self.heads, d = k0.shape
        if d != head_dim or k0.stride(3) != 1:
            raise RuntimeError(f"kvaudit: unexpected paged KV view {tuple(k0.shape)} / strides {k0.stride()}")
        self.elsize = k0.element_size()
        self.strides = k0.stride()[:3]
        self.v_off = (v0.data_ptr() - k0.data_ptr()) // self.elsize
        for k, v in views:
            if k.shape != k0.shape or k.stride() != k0.stride() or k.dtype != k0.dtype or \
                    (v.data_ptr() - k.data_ptr()) // self.elsize != self.v_off:
                raise RuntimeError("kvaudit: vLLM's layers do not share one paged layout")
        self.layer_off = torch.tensor([self._off(k) for k in self.k_views], dtype=torch.int64, device=self.device)
        self.n_layers = len(layer_kvs)
        self._inv_freq64 = rope.inv_freq.double()

    def _off(self, t: torch.Tensor) -> int:
        diff = t.data_ptr() - self.base.data_ptr()
        if diff % self.elsize:
            raise RuntimeError("kvaudit: tensor not aligned to the KV cache's element size")
        return diff // self.elsize

    def _trig(self, deltas: list[int]) -> torch.Tensor:
        freqs = torch.tensor(deltas, dtype=torch.float64)[:, None] * self._inv_freq64[None, :]
        return torch.stack([freqs.cos(), freqs.sin()], dim=1).float()  # [P, 2, HALF]

    # ------------------------------------------------------------------ load

    def load(self, pieces: list[Piece], *, tokens_per_program: int = LOAD_TOKENS_PER_PROGRAM,
             num_warps: int = LOAD_WARPS) -> None:
        """Write every piece into the paged cache, keys rotated, in one kernel launch (the tile
        arguments are the kernel's, for ``benchmarks/paged_load.py``)."""
        if not pieces:
            return
        for pc in pieces:
            if pc.keys.dtype != self.dtype or pc.keys.device != self.device or not pc.keys.is_contiguous() \
                    or not pc.values.is_contiguous() or pc.keys.shape[0] != self.n_layers \
                    or tuple(pc.keys.shape[2:]) != (self.heads, self.head_dim):
                raise RuntimeError("kvaudit: a store entry does not match the paged cache's layout")
        if self.impl == "torch":
            return self._load_torch(pieces)
        desc, tables, bt_len = [], [], 0
        for pc in pieces:
            desc += [self._off(pc.keys), self._off(pc.values), pc.keys.shape[1] * self.heads * self.head_dim,
                     pc.src_tok0, pc.n, pc.dst_pos0, bt_len, 0]
            tables += pc.block_ids
            bt_len += len(pc.block_ids)
        meta = torch.tensor(desc + tables, dtype=torch.int64).to(self.device, non_blocking=True)
        trig = self._trig([pc.delta for pc in pieces]).to(self.device, non_blocking=True)
        longest = max(pc.n for pc in pieces)
        # a grid's second axis holds at most 65535 programs: a longer entry takes wider tiles
        tokens_per_program = max(tokens_per_program, _next_pow2(-(-longest // 65535)))
        chunks = -(-longest // tokens_per_program)
        if len(pieces) > 65535 or self.n_layers > 65535:
            raise RuntimeError("kvaudit: too many entries or layers for one load launch")
        load_kernel, _ = _kernels()
        half = self.head_dim // 2
        load_kernel[(len(pieces), chunks, self.n_layers)](
            self.base, meta, trig, self.layer_off, len(pieces), *self.strides, self.v_off,
            BS=self.block_size, H=self.heads, D=self.head_dim, HALF=half,
            CP=_next_pow2(self.heads * half), BT=tokens_per_program, num_warps=num_warps,
            enable_fp_fusion=False)  # products rounded as in RopeSpec.rotate: the same bits

    # ------------------------------------------------------------------ same-step copies

    def copy_plan(self, copies: list[tuple[list[int], list[int], int, int]]) -> tuple[torch.Tensor, ...]:
        """(source block, source offset, destination block, destination offset) index tensors, on
        the cache's device (one transfer), of positions [start, end) copied from one request's
        blocks to another's, for each (source block ids, destination block ids, start, end)."""
        idx: list[list[int]] = [[], [], [], []]
        for src, dst, a, b in copies:
            for pos in range(a, b):
                blk, off = divmod(pos, self.block_size)
                idx[0].append(src[blk])
                idx[1].append(off)
                idx[2].append(dst[blk])
                idx[3].append(off)
        return tuple(torch.tensor(idx, dtype=torch.int64).to(self.device, non_blocking=True).unbind(0))

    def copy_layer(self, kv: torch.Tensor, plan: tuple[torch.Tensor, ...]) -> None:
        """One layer's keys and values (the whole ``2 * head_dim`` row) from the plan's source slots
        to its destination slots: a gather and a scatter on the stream, after the layer's KV write."""
        sb, so, db, do = plan
        t = kv.transpose(1, 2)  # [blocks, block_size, kv_heads, 2 * head_dim], a view
        t[db, do] = t[sb, so]

    def _slots(self, block_ids: list[int], pos0: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(pos0, pos0 + n, device=self.device)
        blocks = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        return blocks[pos // self.block_size], pos % self.block_size

    def _load_torch(self, pieces: list[Piece]) -> None:
        for pc in pieces:
            blk, off = self._slots(pc.block_ids, pc.dst_pos0, pc.n)
            keys = pc.keys[:, pc.src_tok0: pc.src_tok0 + pc.n]
            if pc.delta:
                keys = self.rope.rotate(keys, pc.delta)
            for li in range(self.n_layers):
                self.k_views[li][blk, off] = keys[li]
                self.v_views[li][blk, off] = pc.values[li, pc.src_tok0: pc.src_tok0 + pc.n]

    # ------------------------------------------------------------------ gather

    def gather(self, block_ids: list[int], start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """KV of request positions [start, end) as new ``[layers, tokens, kv_heads, head_dim]`` tensors."""
        n = end - start
        shape = (self.n_layers, n, self.heads, self.head_dim)
        if self.impl == "torch":
            blk, off = self._slots(block_ids, start, n)
            return (torch.stack([k[blk, off] for k in self.k_views]),
                    torch.stack([v[blk, off] for v in self.v_views]))
        keys = torch.empty(shape, dtype=self.dtype, device=self.device)
        values = torch.empty_like(keys)
        if n == 0:
            return keys, values
        bt = torch.tensor(block_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        _, gather_kernel = _kernels()
        gather_kernel[(-(-n // TOKENS_PER_PROGRAM), self.n_layers)](
            self.base, bt, self.layer_off, keys, values, n, start, *self.strides, self.v_off,
            BS=self.block_size, H=self.heads, D=self.head_dim, CP=_next_pow2(self.heads * self.head_dim),
            BT=TOKENS_PER_PROGRAM, num_warps=4)
        return keys, values
