"""Tensor and pipeline parallelism without a second GPU (issue 17's CPU part; the runs on two GPUs
need a kind that is not lent): the vLLM backend refuses a split the model cannot take before any
engine starts, and the workers' store replies merge into one, checked here with fake ranks, each a
real :class:`~kvaudit.runners.engines.vllm.store.SegmentStore` holding its share of an entry (its KV heads
under tensor parallelism, its stage's layers under pipeline parallelism)."""

from __future__ import annotations

import json

import pytest

from kvaudit.core.errors import KvauditError
from kvaudit.runners.engines.vllm.engine_setup import (
    check_parallelism,
    combined_fingerprint,
    merge_worker_replies,
)


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


# --------------------------------------------------------------------------- fake ranks

def _kv(layers: int = 4, n: int = 10, heads: int = 4, d: int = 8, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(layers, n, heads, d, generator=g), torch.randn(layers, n, heads, d, generator=g)


def _ranks(split: str, keys, values, start: int = 5, key: str = "seg:a"):
    """Two fake workers holding their shares of one entry: ``tp`` splits the KV heads, ``pp`` the layers."""
    from kvaudit.runners.engines.vllm.store import SegmentStore, StoredKV

    stores = []
    for r in range(2):
        if split == "tp":
            h = keys.shape[2] // 2
            k, v = keys[:, :, r * h:(r + 1) * h], values[:, :, r * h:(r + 1) * h]
        else:
            n_layers = keys.shape[0] // 2
            k, v = keys[r * n_layers:(r + 1) * n_layers], values[r * n_layers:(r + 1) * n_layers]
        st = SegmentStore(1 << 20)
        assert st.put(key, StoredKV(k.contiguous(), v.contiguous(), start))
        stores.append(st)
    return stores


@pytest.mark.parametrize("split", ["tp", "pp"])
def test_the_shares_of_one_entry_merge_into_one_held_entry(split):
    keys, values = _kv()
    stores = _ranks(split, keys, values)
    replies = [st.info() for st in stores]
    merged = merge_worker_replies("info", replies)
    fp, n, nbytes, start = merged["seg:a"]
    assert (n, start) == (10, 5)
    assert nbytes == keys.numel() * keys.element_size() * 2  # both shares, keys and values
    assert fp == combined_fingerprint([r["seg:a"][0] for r in replies]) and fp not in (replies[0]["seg:a"][0],
                                                                                      replies[1]["seg:a"][0])
    # A change in either rank's share changes the entry's fingerprint: the history-independence
    # check sees a divergence on any rank, not only on the first worker.
    for r in range(2):
        other = _ranks(split, keys, values)
        e = other[r].get("seg:a")
        e.keys[0, 0, 0, 0] += 1.0
        e._fingerprint = ""
        assert merge_worker_replies("info", [st.info() for st in other])["seg:a"][0] != fp


@pytest.mark.parametrize("split", ["tp", "pp"])
def test_each_rank_rerotates_its_share_to_what_the_whole_entry_rerotates_to(split):
    """The connector re-rotates on each worker what that worker holds; RoPE acts on each head and
    each layer alone, so the shares rotated apart and put together equal the whole rotated."""
    import torch
    from transformers import LlamaConfig

    from kvaudit.runners.rope import RopeSpec

    rope = RopeSpec.from_config(LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                                            head_dim=8, rope_theta=10000.0))
    keys, values = _kv()
    whole = rope.rotate(keys, 37)
    shares = [rope.rotate(st.get("seg:a").keys, 37) for st in _ranks(split, keys, values)]
    together = torch.cat(shares, dim=2 if split == "tp" else 0)
    assert torch.allclose(together, whole, atol=1e-6)
    assert float((whole - keys).abs().max()) > 1e-2  # the rotation really moved the keys


def test_an_entry_one_rank_lacks_is_not_held_and_ranks_that_disagree_are_an_error():
    keys, values = _kv()
    stores = _ranks("tp", keys, values)
    stores[1].drop(["seg:a"], evicted=True)
    assert merge_worker_replies("info", [st.info() for st in stores]) == {}  # loading it would fail on rank 1
    assert merge_worker_replies("evicted", [st.drain_evicted() for st in stores]) == ["seg:a"]
    stores = _ranks("tp", keys, values)
    other = _ranks("tp", keys[:, :8], values[:, :8])  # rank 1 holds 8 tokens under the same key
    with pytest.raises(KvauditError, match="rank 1 holds 8 tokens from position 5, rank 0 10 from 5"):
        merge_worker_replies("info", [stores[0].info(), other[1].info()])


def test_store_stats_merge_to_the_fullest_worker():
    keys, values = _kv()
    stores = _ranks("pp", keys, values)
    stores[1].put("seg:b", stores[1].get("seg:a"))  # rank 1 holds more
    stats = merge_worker_replies("stats", [st.stats() for st in stores])
    assert stats["bytes"] == stores[1].bytes_now > stores[0].bytes_now
    assert stats["workers"] == 2 and len(stats["per_worker"]) == 2
    one = merge_worker_replies("stats", [stores[0].stats()])
    assert one["bytes"] == stores[0].bytes_now and one["workers"] == 1


def test_a_store_budget_past_the_free_memory_is_refused_naming_what_fits():
    from kvaudit.runners.engines.vllm.engine_setup import STORE_HEADROOM_BYTES, check_store_room

    free = 30 * 10**9
    check_store_room([("cuda:0", free)], free - STORE_HEADROOM_BYTES)  # fits, headroom kept
    with pytest.raises(KvauditError) as e:
        check_store_room([("cuda:0", free)], free - STORE_HEADROOM_BYTES + 1)
    assert "--cache-budget 28.9 GB: the segment store keeps its KV in cuda:0, where 30.0 GB is free" in str(e.value)
    assert "a budget of at most 28.9 GB fits there" in str(e.value)
    # per worker: the fullest device decides, the budget is the workers' total
    with pytest.raises(KvauditError) as e:
        check_store_room([("cuda:0", 50 * 10**9), ("cuda:1", free)], 40 * 10**9, workers=2)
    assert "--cache-budget 80.0 GB, 40.0 GB of it on each of 2 workers" in str(e.value)
    assert "in cuda:1, where 30.0 GB is free" in str(e.value) and "at most 57.9 GB fits" in str(e.value)


def test_each_rank_stamps_when_it_was_offered_an_entry_and_the_entry_is_whole_at_the_last_stamp():
    """The replay places a warm-up's store where the worker ran it (``offered_at``, the host's
    monotonic clock), not where the frontend saw the warm-up finish: under vLLM's asynchronous
    scheduling the two are an engine step apart (2026-12-07). A refusal is stamped too."""
    import time

    from kvaudit.runners.engines.vllm.store import SegmentStore, StoredKV

    keys, values = _kv()
    before = time.monotonic()
    stores = _ranks("tp", keys, values)
    stamps = [st.offered_at(["seg:a", "seg:missing"]) for st in stores]
    assert all(list(s) == ["seg:a"] and before <= s["seg:a"] <= time.monotonic() for s in stamps)
    assert stamps[0]["seg:a"] <= stamps[1]["seg:a"]  # rank 1 stored its share after rank 0
    assert merge_worker_replies("offered_at", stamps) == {"seg:a": stamps[1]["seg:a"]}
    stores[0].drop(["seg:a"])
    assert merge_worker_replies("offered_at", [st.offered_at(["seg:a"]) for st in stores]) == {}
    small = SegmentStore(keys.numel())  # half of one entry's keys and values: refused
    assert not small.put("seg:b", StoredKV(keys, values, 0))
    refused = small.offered_at(["seg:b"])["seg:b"]
    assert before <= refused <= time.monotonic() and small.offered_at(["seg:b"]) == {}  # given once
