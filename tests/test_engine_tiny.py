"""Engine correctness on tiny random-weight models (built from a config in the test, no download)."""

from __future__ import annotations

import pytest
import torch

from kvaudit.core.arms import get_arm
from kvaudit.core.dataset_format import Case, Segment, segment_id
from kvaudit.core.errors import UnsupportedModelError
from kvaudit.runners.engines.transformers.backend import Decoding, TransformersBackend
from kvaudit.runners.prompt import assemble
from kvaudit.runners.rope import RopeSpec

DOCS = [
    "Harrow Point is a 1987 drama film directed by Lisa Marvell and released by Corvane Studios.",
    "Blue Canyon Drive is a 1993 thriller directed by Oren Pask, who was born in Velmora in 1950.",
    "The Paper Orchid is a 2004 comedy directed by Hana Brill; it grossed 88 million dollars.",
]
SEGS = {segment_id(t): Segment(segment_id(t), t) for t in DOCS}


@pytest.fixture(scope="module")
def tokenizer():
    from kvaudit.models import load_tokenizer

    return load_tokenizer("smollm2")


def tiny_model(kind: str = "llama", **overrides):
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  tie_word_embeddings=True)
    common.update(overrides)
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[kind]
    model = model_cls(cfg_cls(**common)).eval()
    # Random init gives near-uniform logits; scale up so differences would show.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20)
    return model


def backend_for(model, tokenizer) -> TransformersBackend:
    return TransformersBackend(model, tokenizer, "tiny", decoding=Decoding(max_new_tokens=4))


def make_case(prefix: str = "Session 4411, 2026-11-30.\n") -> Case:
    return Case(id="t1", task="single_doc", segment_ids=list(SEGS), question="Who directed Harrow Point?",
                answers=["Lisa Marvell"], prefix=prefix)


def first_logits(be: TransformersBackend, arm: str, prompt):
    out = be.run_arm(prompt, get_arm(arm))
    return out.first_logits, out.result


LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256}
LINEAR = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}


@pytest.mark.parametrize("kind,overrides", [
    ("llama", {}),
    ("llama", {"num_key_value_heads": 4}),  # plain multi-head attention
    ("llama", {"num_key_value_heads": 1}),  # multi-query
    ("llama", {"rope_parameters": LLAMA3}),
    ("llama", {"rope_parameters": YARN}),
    ("llama", {"rope_parameters": LINEAR}),
    ("qwen2", {}),
    ("mistral", {"sliding_window": None}),
])
def test_identity_equals_recompute(tokenizer, kind, overrides):
    be = backend_for(tiny_model(kind, **overrides), tokenizer)
    prompt = assemble(make_case(), SEGS, be.tok, be.max_prompt_tokens)
    ref, rec = first_logits(be, "recompute", prompt)
    ident, res = first_logits(be, "identity", prompt)
    assert res.tokens_reused == sum(e - s for s, e in prompt.spans) > 0
    assert float((ref - ident).abs().max()) <= 1e-4
    assert res.answer_ids == rec.answer_ids


@pytest.mark.parametrize("rope", [None, LLAMA3, YARN, LINEAR])
def test_rerotated_keys_match_keys_computed_at_target(tokenizer, rope):
    over = {"rope_parameters": rope} if rope else {}
    be = backend_for(tiny_model("llama", **over), tokenizer)
    unit = be.tok.unit_ids(DOCS[0])
    head_a = be.tok.head_ids("System A.", "")
    head_b = be.tok.head_ids("A much longer system prompt that moves the document further along.", "x " * 37)
    (a,) = be.capture(head_a + unit, [(len(head_a), len(head_a) + len(unit))])
    (b,) = be.capture(head_b + unit, [(len(head_b), len(head_b) + len(unit))])
    delta = b.start - a.start
    assert delta > 40
    moved = be.rope.rotate(a.keys[0], delta)
    # Layer 0 keys depend only on the token and its position, so they must match exactly.
    assert float((moved - b.keys[0]).abs().max()) <= 1e-5
    assert float((a.keys[0] - b.keys[0]).abs().max()) > 1e-2  # without rotation they differ


def test_reuse_differs_without_rerotation_and_counts_tokens(tokenizer):
    be = backend_for(tiny_model("llama"), tokenizer)
    prompt = assemble(make_case(), SEGS, be.tok, be.max_prompt_tokens)
    ref, _ = first_logits(be, "recompute", prompt)
    reuse, r = first_logits(be, "reuse", prompt)
    norope, _ = first_logits(be, "reuse_norope", prompt)
    seg_tokens = sum(e - s for s, e in prompt.spans)
    assert r.tokens_reused == seg_tokens and r.tokens_computed == len(prompt.ids) - seg_tokens
    assert float((ref - norope).abs().max()) > float((ref - reuse).abs().max())
    assert be.cache.stats.builds == len(SEGS)  # built once, then served from the cache
    assert be.cache.stats.hits == len(SEGS)


def test_same_ids_for_every_arm(tokenizer):
    be = backend_for(tiny_model("llama"), tokenizer)
    prompt = assemble(make_case(), SEGS, be.tok, be.max_prompt_tokens)
    results = [be.run_arm(prompt, get_arm(a)).result for a in ("recompute", "reuse", "identity", "reuse_norope")]
    assert len({r.ids_hash for r in results}) == 1
    assert len({tuple(r.segment_hashes) for r in results}) == 1


@pytest.mark.parametrize("kind,overrides,match", [
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}, "dynamic"),
    ("llama", {"head_dim": 16, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                    "partial_rotary_factor": 0.5}}, "partial"),
])
def test_unsupported_rope_is_refused(kind, overrides, match):
    with pytest.raises(UnsupportedModelError, match=match):
        RopeSpec.from_model(tiny_model(kind, **overrides))


def test_model_without_rope_is_refused():
    import transformers

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))
    with pytest.raises(UnsupportedModelError, match="not supported"):
        RopeSpec.from_model(model)


def test_sliding_window_limits_prompt_length(tokenizer):
    be = backend_for(tiny_model("mistral", sliding_window=64), tokenizer)
    assert be.max_prompt_tokens == 64
    from kvaudit.core.errors import KvauditError

    with pytest.raises(KvauditError, match="over the limit"):
        assemble(make_case(), SEGS, be.tok, be.max_prompt_tokens)


def test_truncation_drops_whole_trailing_segments(tokenizer):
    be = backend_for(tiny_model("llama"), tokenizer)
    full = assemble(make_case(), SEGS, be.tok, 10_000)
    limit = full.tail_start - (full.spans[-1][1] - full.spans[-1][0]) + (len(full.ids) - full.tail_start)
    cut = assemble(make_case(), SEGS, be.tok, limit)
    assert cut.truncation["truncated"] and cut.truncation["dropped_segments"] == [list(SEGS)[-1]]
    assert cut.ids[: cut.tail_start] == full.ids[: full.spans[-1][0]]
    assert len(cut.ids) <= limit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_into_a_cache_slice_equals_the_textbook_formula(dtype):
    from kvaudit.runners.rope import rotate_half

    spec = RopeSpec(inv_freq=1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)), rope_type="default", head_dim=16)
    keys = torch.randn(2, 3, 7, 16).to(dtype)
    cos, sin = spec.cos_sin(123, keys.device, torch.float32)
    expected = (keys.float() * cos + rotate_half(keys.float()) * sin).to(dtype)
    buf = torch.zeros(2, 3, 20, 16, dtype=dtype)
    spec.rotate(keys, 123, out=buf[:, :, 5:12])
    assert torch.equal(buf[:, :, 5:12], expected)
    assert torch.equal(spec.rotate(keys, 123), expected)
    assert not buf[:, :, :5].any() and not buf[:, :, 12:].any()  # nothing written outside the slice
