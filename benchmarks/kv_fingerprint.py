"""What fingerprinting a saved KV entry costs inside an engine step, per layer vs grouped, side by side.

    python3 benchmarks/kv_fingerprint.py [--layers 32] [--kv-heads 8] [--head-dim 128] [--tokens 38,1024,8192,32768]

Every entry the vLLM connector saves (a head, a segment, a capture) is fingerprinted in the same
engine step (``SegmentStore.info`` -> :func:`kvaudit.runners.kvstore.kv_fingerprint`), so the step,
and the TTFT of the request that saves, waits for it. Until 2026-12-02 the device checksum summed
one layer at a time (about five kernel launches per layer and tensor: 320 launches for a 32-layer
model); :func:`kvaudit.runners.kvstore.device_checksums` sums layers in groups of up to 2^24 words.
Both are timed here on the same tensors (bf16 keys and values shaped like a store entry:
layers x tokens x KV heads x head dim), median of ``--repeats`` after a warm-up, with the digests
checked equal. Issue 28: the head request inside the reuse arm took 16-18 ms on the H200 with CUDA
graphs against 10-13 ms for the same head sent alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kvaudit.runners.kvstore import device_checksums  # noqa: E402


def per_layer(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The checksum as it was: one layer at a time."""
    sums = []
    for t in (keys, values):
        flat = t.contiguous().view(t.shape[0], -1)
        words = flat.view(torch.int16) if flat.element_size() == 2 else flat.view(torch.int32)
        weight = torch.arange(words.shape[1], device=t.device, dtype=torch.int64) % 65521 + 1
        for layer in words:
            w = layer.to(torch.int64)
            sums.append(torch.stack([w.sum(), (w * weight).sum()]))
    return torch.stack(sums)


def timed(fn, keys: torch.Tensor, values: torch.Tensor, repeats: int) -> tuple[float, bytes]:
    out = fn(keys, values).cpu()  # warm-up; .cpu() is the synchronisation the step pays
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(keys, values).cpu()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out.numpy().tobytes()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--tokens", default="38,1024,8192,32768")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}; {args.layers} layers, "
          f"{args.kv_heads} KV heads, head dim {args.head_dim}, bf16")
    print("| tokens | per layer ms | grouped ms | per layer / grouped | digests equal |")
    print("|---:|---:|---:|---:|---|")
    rows = []
    for n in (int(x) for x in args.tokens.split(",")):
        shape = (args.layers, n, args.kv_heads, args.head_dim)
        keys = torch.randn(shape, device=dev).to(torch.bfloat16)
        values = torch.randn(shape, device=dev).to(torch.bfloat16)
        old_s, old_b = timed(per_layer, keys, values, args.repeats)
        new_s, new_b = timed(device_checksums, keys, values, args.repeats)
        rows.append({"tokens": n, "per_layer_ms": 1e3 * old_s, "grouped_ms": 1e3 * new_s, "equal": old_b == new_b})
        print(f"| {n} | {1e3 * old_s:.2f} | {1e3 * new_s:.2f} | {old_s / new_s:.1f}x | {old_b == new_b} |", flush=True)
        del keys, values
    if args.json:
        args.json.write_text(json.dumps({"device": dev, "rows": rows}, indent=1))
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
