"""Repair arms on the real default model (SmolLM2, fp32, CPU), three example cases: the controls
(recompute nothing = reuse bit for bit, recompute everything = recompute within the identity
tolerance), the audit passing with them, blend's selection being the top-deviation tokens, the
mask hiding the stale reused entries, the cost accounting and the frontier in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvaudit.core.arms import get_arm, repair_count
from kvaudit.core.dataset_format import read_dataset
from kvaudit.core.repair_log import read_repairs
from kvaudit.core.run_format import read_pairs
from kvaudit.runners.prompt import assemble
from kvaudit.runners.registry import arms_for

from .conftest import EXAMPLE

ARMS = "recompute,reuse,identity,blend@0,blend@0.15,blend@1,epic@0,epic@16,epic@100000,oracle"


@pytest.fixture(scope="module")
def repair_run(smollm2_backend, tmp_path_factory) -> Path:
    from kvaudit.runners.runner import RunConfig, execute

    out = tmp_path_factory.mktemp("repairs") / "run"
    cfg = RunConfig(dataset=read_dataset(EXAMPLE), out=out, arms=arms_for(ARMS, "transformers"),
                    model_name="smollm2", limit=3)
    execute(cfg, smollm2_backend, progress=False)
    return out


def test_controls_hold_on_the_real_model(repair_run):
    pairs = read_pairs(repair_run)
    assert len(pairs) == 3
    for p in pairs:
        ref, reuse = p.arms["recompute"], p.arms["reuse"]
        for name in ("blend@1", "epic@100000"):  # every segment token recomputed
            r = p.arms[name]
            assert r.tokens_reused == 0 and r.logit_diff_vs_recompute <= 1e-4, (p.case_id, name)
            assert r.answer_ids == ref.answer_ids, (p.case_id, name)
        for name in ("blend@0", "epic@0"):  # nothing recomputed: reuse, bit for bit
            r = p.arms[name]
            assert (r.answer_ids, r.top_k, r.margin, r.logit_diff_vs_recompute) == (
                reuse.answer_ids, reuse.top_k, reuse.margin, reuse.logit_diff_vs_recompute), (p.case_id, name)
    acct = read_repairs(repair_run)
    assert all(acct[(p.case_id, a)]["logit_diff_vs_reuse"] == 0.0 for p in pairs for a in ("blend@0", "epic@0"))


def test_audit_passes_with_the_repair_controls(repair_run):
    from kvaudit.audit.trust import build_audit

    audit = build_audit(repair_run)
    audit = audit if isinstance(audit, dict) else audit.to_dict()
    by = {c["name"]: c for c in audit["checks"]}
    assert audit["verdict"] == "passed", [c for c in audit["checks"] if not c["passed"]]
    assert "blend@0 on 3" in by["repair_equals_reuse"]["detail"]
    assert "blend@1 on 3 cases" in by["repair_equals_recompute"]["detail"]


def test_partial_repairs_recompute_their_count_and_pay_for_it_in_ttft(repair_run):
    acct = read_repairs(repair_run)
    gains = []
    for p in read_pairs(repair_run):
        spans = [tuple(s) for s in p.segment_spans]
        seg = sum(e - s for s, e in spans)
        for name in ("blend@0.15", "epic@16"):
            a, r = acct[(p.case_id, name)], p.arms[name]
            k = repair_count(get_arm(name), spans)
            assert a["n_recomputed"] == len(a["recomputed"]) == k == seg - r.tokens_reused > 0
            assert all(any(s <= q < e for s, e in spans) for q in a["recomputed"])
            assert a["recomputed"] == sorted(set(a["recomputed"]))
            assert r.ttft_s >= a["select_s"] + a["recompute_s"]
        epic = acct[(p.case_id, "epic@16")]["recomputed"]
        assert epic == [q for s, e in spans for q in range(s, min(e, s + 16))]
        gains.append(p.arms["reuse"].logit_diff_vs_recompute - p.arms["blend@0.15"].logit_diff_vs_recompute)
    # recomputing the 15% that deviate most brings the first-token logits closer to recompute's
    assert sum(gains) / len(gains) > 0.3, gains


def test_blend_selects_the_top_deviation_tokens(smollm2_backend, repair_run):
    be = smollm2_backend
    ds = read_dataset(EXAMPLE)
    case = ds.cases[2]
    prompt = assemble(case, ds.segments, be.tok, be.max_prompt_tokens)
    spec = get_arm("blend@0.15")
    entries = [e for e, _ in be.neutral_entries(prompt)]
    cache, _, _ = be.prefill(prompt, get_arm("reuse"), entries)
    be.truncate(cache, prompt.tail_start)
    dev = be.kv_deviation(prompt, cache)
    chosen = be.select_tokens(prompt, spec, cache)
    k = repair_count(spec, prompt.spans)
    assert len(chosen) == k and dev.max() > 0
    picked = dev[torch.tensor(chosen) - prompt.head_len]
    rest = torch.ones_like(dev, dtype=torch.bool)
    rest[torch.tensor(chosen) - prompt.head_len] = False
    assert picked.min() >= dev[rest].max()
    assert chosen == json.loads(json.dumps(read_repairs(repair_run)[(case.id, spec.name)]["recomputed"]))


def test_recomputing_every_token_ignores_the_stale_reused_entries(smollm2_backend):
    """The mask must hide the reused entries of recomputed tokens: with garbage there, recomputing
    every segment token still gives recompute's logits."""
    be = smollm2_backend
    ds = read_dataset(EXAMPLE)
    prompt = assemble(ds.cases[0], ds.segments, be.tok, be.max_prompt_tokens)
    _, want, _ = be.prefill(prompt, get_arm("recompute"), [])
    entries = [e for e, _ in be.neutral_entries(prompt)]
    cache, _, _ = be.prefill(prompt, get_arm("reuse"), entries)
    be.truncate(cache, prompt.tail_start)
    h, n = prompt.head_len, prompt.tail_start
    with torch.inference_mode():  # the cache's tensors are inference tensors
        for layer in cache.layers:
            layer.keys[:, :, h:n] = torch.randn_like(layer.keys[:, :, h:n]) * 50
            layer.values[:, :, h:n] = torch.randn_like(layer.values[:, :, h:n]) * 50
    be.recompute_tokens(prompt, cache, list(range(h, n)))
    got = be.forward(prompt.ids[n:], n, cache)[-1]
    assert float((got - want).abs().max()) <= 1e-4


def test_the_summary_holds_the_frontier(repair_run):
    from kvaudit.reports.report import write_report

    write_report(repair_run)
    f = json.loads((repair_run / "summary.json").read_text())["frontier"]
    overall = next(g for g in f["groups"] if g["group"] == "overall")
    pts = {p["arm"]: p for p in overall["points"]}
    assert set(pts) == {"reuse", "blend@0", "blend@0.15", "blend@1", "epic@0", "epic@16", "epic@100000"}
    assert pts["blend@1"]["recomputed_share"] == 1.0 and pts["reuse"]["recomputed_share"] == 0.0
    assert 0.14 < pts["blend@0.15"]["recomputed_share"] < 0.16
    assert pts["blend@0.15"]["select_median"] > 0 and pts["epic@16"]["select_median"] is not None
    assert f["oracle"], "the oracle split is missing"
