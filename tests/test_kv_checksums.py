"""The device checksum behind GPU KV fingerprints: grouping layers into one launch must give the
same per-layer sums as summing each layer on its own (the digest a run records must not depend on
how many layers were summed at once), and must change when one word or the word order changes."""

import pytest
import torch

import kvaudit.runners.kvstore as kvstore


def _per_layer(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    sums = []
    for t in (keys, values):
        words = t.contiguous().view(t.shape[0], -1)
        words = words.view(torch.int16) if words.element_size() == 2 else words.view(torch.int32)
        weight = torch.arange(words.shape[1], dtype=torch.int64) % 65521 + 1
        for layer in words:
            w = layer.to(torch.int64)
            sums.append(torch.stack([w.sum(), (w * weight).sum()]))
    return torch.stack(sums)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("group_words", [1, 300, 1 << 27])
def test_grouped_checksums_equal_per_layer_sums(monkeypatch, dtype, group_words):
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(7, 41, 2, 8, generator=g).to(dtype)
    values = torch.randn(7, 41, 2, 8, generator=g).to(dtype)
    monkeypatch.setattr(kvstore, "_CHECKSUM_WORDS", group_words)
    assert torch.equal(kvstore.device_checksums(keys, values), _per_layer(keys, values))


def test_checksums_see_a_changed_word_and_a_swap():
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(3, 16, 2, 4, generator=g).to(torch.bfloat16)
    values = torch.randn(3, 16, 2, 4, generator=g).to(torch.bfloat16)
    base = kvstore.device_checksums(keys, values)
    changed = keys.clone()
    changed[1, 5, 0, 2] += 1
    assert not torch.equal(kvstore.device_checksums(changed, values), base)
    swapped = keys.clone()
    swapped[2, [3, 4]] = keys[2, [4, 3]]
    assert not torch.equal(kvstore.device_checksums(swapped, values), base)
