"""The vLLM backend refuses a tensor/pipeline split the model cannot take, before any engine starts
(issue 17's CPU part; the runs on two GPUs need a kind that is not lent)."""

from __future__ import annotations

import json

import pytest

from kvaudit.core.errors import KvauditError
from kvaudit.runners.vllm_setup import check_parallelism


def shape(tmp_path, heads: int, kv_heads: int, layers: int = 32):
    d = tmp_path / f"shape-{heads}-{kv_heads}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128 * heads,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "num_hidden_layers": layers,
        "intermediate_size": 256, "vocab_size": 1000}))
    return d


def test_smollm2_shape_refuses_tp2_with_a_clear_message(tmp_path):
    d = shape(tmp_path, heads=9, kv_heads=3, layers=30)  # SmolLM2-135M's heads
    with pytest.raises(KvauditError, match="--tensor-parallel-size 2 does not split .*9 attention heads and 3 KV heads"):
        check_parallelism(d, 2, 1)
    check_parallelism(d, 3, 1)  # divides both
    check_parallelism(d, 1, 2)  # pipeline stages split layers, not heads


def test_llama_8b_shape_takes_tp2_and_pp2(tmp_path):
    d = shape(tmp_path, heads=32, kv_heads=8)
    check_parallelism(d, 2, 1)
    check_parallelism(d, 1, 2)
    check_parallelism(d, 16, 1)  # 8 KV heads replicate evenly over 16 ranks
    with pytest.raises(KvauditError, match="does not split"):
        check_parallelism(d, 3, 1)
    with pytest.raises(KvauditError, match="exceeds .* 32 layers"):
        check_parallelism(d, 1, 33)
    with pytest.raises(KvauditError, match="positive integer"):
        check_parallelism(d, 0, 1)
