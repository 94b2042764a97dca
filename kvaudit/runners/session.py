"""The transformers backend's opener (registered in :mod:`kvaudit.runners.registry`) and the
per-case console summary of a run, for any backend."""

from __future__ import annotations

from pathlib import Path

from kvaudit.core.arms import REFERENCE_ARM, UNDER_TEST_ARM
from kvaudit.core.manifest import Manifest
from kvaudit.core.run_dir import RunDir
from kvaudit.runners.backend import Decoding
from kvaudit.runners.transformers_backend import TransformersBackend


def open_backend(model: str = "smollm2", *, dtype: str = "float32", device: str = "cpu",
                 threads: int | None = None, max_new_tokens: int = 24,
                 cache_bytes: int = 2 << 30) -> TransformersBackend:
    """The transformers backend's opener (registered as ``transformers`` in runners.registry)."""
    import torch

    from kvaudit.models import load_model

    if threads:
        torch.set_num_threads(threads)
    lm = load_model(model, dtype=dtype, device=device)
    return TransformersBackend(lm.model, lm.tokenizer, lm.fingerprint,
                               decoding=Decoding(max_new_tokens=max_new_tokens),
                               cache_bytes=cache_bytes, device=device)


def print_run_summary(run_dir: Path, manifest: Manifest, max_rows: int = 200) -> None:
    """Per case and arm: answer, first-token margin, TTFT and reused tokens."""
    run = RunDir(run_dir)
    pairs = run.read_pairs()
    print(f"\n{'case':<18} {'arm':<17} {'margin':>7} {'ttft_s':>7} {'reused':>6} {'dlogit':>8}  answer")
    for rec in pairs[:max_rows]:
        for name in rec.arm_order:
            r = rec.arms[name]
            d = "" if r.logit_diff_vs_recompute is None else f"{r.logit_diff_vs_recompute:.2e}"
            ans = r.answer.replace("\n", " ")[:60]
            print(f"{rec.case_id[:18]:<18} {name:<17} {r.margin:7.3f} {r.ttft_s:7.3f} {r.tokens_reused:6d} {d:>8}  {ans}")
    if len(pairs) > max_rows:
        print(f"... {len(pairs) - max_rows} more cases in {run.pairs_file}")
    t = manifest.timing_s or {}
    print(f"\n{len(pairs)} cases in {run_dir}; wall {t.get('wall', 0):.1f}s "
          f"({REFERENCE_ARM} {t.get(REFERENCE_ARM, 0):.1f}s, {UNDER_TEST_ARM} {t.get(UNDER_TEST_ARM, 0):.1f}s, "
          f"controls {t.get('controls', 0):.1f}s, one-time caching {t.get('caching', 0):.1f}s)")
