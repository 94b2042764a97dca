"""How fast does the connector's fused load write segment KV into vLLM's paged cache, per tile shape?

    python benchmarks/paged_load.py [--tokens 32768] [--pieces 5] [--repeats 20] [--json FILE]   # a CUDA GPU

The main request of the reuse arm loads its head and documents (``--pieces`` entries, the first a
43-token head, the rest splitting the remaining tokens) into a shuffled block table with one launch
of :meth:`kvaudit.runners.engines.vllm.gpu_paged_kv.PagedKV.load` (keys rotated). This times that
launch for the Llama-3.1-8B KV shape (32 layers, 8 KV heads, head_dim 128, bf16, vLLM's NHD layout,
block size 32) at several tile shapes (tokens per program x warps), side by side in one process,
CUDA-event medians over ``--repeats``, beside the bandwidth floor on the same bytes: one
``Tensor.copy_`` of a contiguous buffer as large as the entries (read once, written once). Every
tile shape must write the same bits as the shipped one (checked; a mismatch exits 1).
Columns: ms, GB/s (bytes read + written), and the ratio to the shipped tile and to the floor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kvaudit.runners.engines.vllm import gpu_paged_kv  # noqa: E402
from kvaudit.runners.engines.vllm.gpu_paged_kv import PagedKV, Piece  # noqa: E402
from kvaudit.runners.rope import RopeSpec  # noqa: E402

LAYERS, HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 32
TILES = [(2, 2), (1, 2), (4, 4), (8, 4)]


def _time(fn, repeats: int) -> float:
    fn()  # compile / warm
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--pieces", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("paged_load: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev, dtype = "cuda", torch.bfloat16
    torch.manual_seed(0)
    blocks = -(-args.tokens // BLOCK) + 8
    caches = [torch.zeros((blocks, BLOCK, HEADS, 2 * HEAD_DIM), dtype=dtype, device=dev).transpose(1, 2)
              for _ in range(LAYERS)]
    inv = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2).double() / HEAD_DIM))
    paged = PagedKV(caches, HEAD_DIM, RopeSpec(inv_freq=inv.float(), rope_type="default", head_dim=HEAD_DIM))
    table = torch.randperm(blocks)[: -(-args.tokens // BLOCK)].tolist()
    head = 43
    rest = args.tokens - head
    sizes = [head] + [rest // (args.pieces - 1) + (i < rest % (args.pieces - 1)) for i in range(args.pieces - 1)]
    pieces, pos = [], 0
    for i, n in enumerate(sizes):
        k = torch.randn(LAYERS, n, HEADS, HEAD_DIM, device=dev).to(dtype)
        v = torch.randn(LAYERS, n, HEADS, HEAD_DIM, device=dev).to(dtype)
        pieces.append(Piece(k, v, 0, n, pos, 0 if i == 0 else pos - 17 * i, table))
        pos += n
    moved = 2 * 2 * LAYERS * args.tokens * HEADS * HEAD_DIM * 2  # K and V, read and written, 2 bytes
    src = torch.empty(moved // 2, dtype=torch.uint8, device=dev)  # read once and written once: moved
    dst = torch.empty_like(src)
    floor = _time(lambda: dst.copy_(src), args.repeats)
    shipped = (gpu_paged_kv.LOAD_TOKENS_PER_PROGRAM, gpu_paged_kv.LOAD_WARPS)
    paged.load(pieces)
    reference = [c.clone() for c in caches]
    rows, failed = [], []
    for bt, warps in [shipped] + [t for t in TILES if t != shipped]:
        for c in caches:
            c.zero_()
        paged.load(pieces, tokens_per_program=bt, num_warps=warps)
        same = all(torch.equal(a, b) for a, b in zip(caches, reference))
        if not same:
            failed.append((bt, warps))
        ms = _time(lambda bt=bt, warps=warps: paged.load(pieces, tokens_per_program=bt, num_warps=warps),
                   args.repeats)
        rows.append({"tokens_per_program": bt, "warps": warps, "ms": ms, "gb_s": moved / ms / 1e6, "same_bits": same})
    base = rows[0]["ms"]
    print(f"{torch.cuda.get_device_name()}: {args.tokens} tokens in {args.pieces} entries, "
          f"{moved / 1e9:.2f} GB moved; copy_ floor {floor:.3f} ms ({moved / floor / 1e6:,.0f} GB/s)")
    print(f"{'tile':>10} {'ms':>8} {'GB/s':>8} {'/shipped':>9} {'/floor':>7} same bits")
    for r in rows:
        print(f"{r['tokens_per_program']:>4} x {r['warps']:<3} {r['ms']:8.3f} {r['gb_s']:8,.0f} "
              f"{r['ms'] / base:9.2f} {r['ms'] / floor:7.2f} {r['same_bits']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "paged_load", "args": vars(args), "shipped": shipped,
                                               "device": torch.cuda.get_device_name(), "floor_ms": floor,
                                               "bytes_moved": moved, "rows": rows}, indent=1))
    if failed:
        print(f"FAILED: tiles {failed} wrote other bits than the shipped one", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
