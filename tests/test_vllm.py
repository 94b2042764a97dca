"""The vLLM backend on CPU: paged layouts, re-rotation in vLLM's cache, arms, audit, tampering.

Skipped where vLLM is not importable (the main ``.venv``); ``make test-vllm`` runs it in
``.venv-vllm``. One small engine (SmolLM2, fp32, ``enforce_eager``; conftest's ``vllm_backend``)
serves the whole session, with its run of the shared five cases (``vllm_run``).
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from kvaudit.core.errors import KvauditError, UnsupportedModelError  # noqa: E402
from kvaudit.runners.engines.vllm import connector as vc  # noqa: E402
from kvaudit.runners.engines.vllm import cpu_layout as vcl  # noqa: E402

from .conftest import VLLM_RUN_ARMS  # noqa: E402

# --------------------------------------------------------------------------- no engine needed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_layout_round_trip_through_vllms_cache_write_op(dtype):
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    blocks, heads, bs, d = 5, 3, 32, 64
    layout = vcl.CpuLayout(_get_attn_isa(dtype, bs, d), bs, heads, d, dtype)
    kv = torch.zeros(blocks, heads, bs, 2 * d, dtype=dtype)
    n = 45
    keys, values = torch.randn(n, heads, d).to(dtype), torch.randn(n, heads, d).to(dtype)
    slots = vcl.slots_for([3, 1], bs, 7, 7 + n)  # starts mid-block, crosses into a second block
    layout.write(kv, keys, values, slots)
    k2, v2 = layout.read(kv, slots)
    assert torch.equal(k2, keys) and torch.equal(v2, values)
    untouched = [b for b in range(blocks) if b not in (1, 3)]
    assert not kv[untouched].any()


def test_both_vllm_lines_are_accepted():
    for v in ("0.26.0", "0.32.0", "0.32.1"):
        vc.check_vllm_version(v)
    for v in ("0.25.1", "0.27.0", "0.33.0"):
        with pytest.raises(KvauditError, match="0.26.x, 0.32.x"):
            vc.check_vllm_version(v)


@pytest.mark.parametrize("n", ["0", "-2"])
def test_a_bad_concurrent_cases_is_refused_before_an_engine_starts(n, tmp_path, capsys):
    from kvaudit.cli import main

    example = Path(__file__).resolve().parents[1] / "kvaudit" / "data" / "example"
    code = main(["run", "--backend", "vllm", "--dataset", str(example), "--out", str(tmp_path / "run"),
                 "--concurrent-cases", n, "--no-progress"])
    assert code == 2
    assert f"--concurrent-cases must be a positive integer, got {n}" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_slots_follow_the_block_table():
    assert vcl.slots_for([5, 2], 4, 2, 7).tolist() == [22, 23, 8, 9, 10]


def test_unknown_vllm_version_and_unsupported_rope_are_refused():
    from transformers import LlamaConfig

    with pytest.raises(KvauditError, match="not supported"):
        vc.check_vllm_version("0.9.1")
    vc.check_vllm_version(vllm.__version__)
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1)
    spec = vc.rope_from_config(cfg)
    assert spec.inv_freq.shape == (16,) and spec.inv_freq[0] == 1.0
    cfg.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(UnsupportedModelError, match="dynamic"):
        vc.rope_from_config(cfg)


# --------------------------------------------------------------------------- one engine


@pytest.fixture
def backend(vllm_backend):
    return vllm_backend


@pytest.fixture(scope="module")
def dataset(boxoffice5):
    from kvaudit.core.dataset_format import read_dataset

    return read_dataset(boxoffice5)


def test_rerotated_neutral_kv_equals_kv_computed_at_the_new_position(backend):
    """Layer-0 keys depend only on the token and its position: moving the neutral copy by +d
    with the config's RoPE must give what vLLM itself computed at +d."""
    unit = backend.tok.unit_ids("The Paper Orchid premiered in 1994.")
    h = len(backend.neutral_head)
    pad = backend.tok.encode(" filler words here" * 5)
    a, b = "tmp:test:a", "tmp:test:b"
    backend._one(backend.neutral_head + unit, max_tokens=1, transfer={"save": [[a, h, h + len(unit)]]})
    backend._one(backend.neutral_head + pad + unit, max_tokens=1,
                 transfer={"save": [[b, h + len(pad), h + len(pad) + len(unit)]]})
    got = backend.store_rpc("get", [a, b])
    ea, eb = got[a], got[b]
    assert eb.start - ea.start == len(pad)
    moved = backend.rope.rotate(ea.keys[0], len(pad))
    assert float((moved - eb.keys[0]).abs().max()) < 1e-4
    assert float((ea.keys[0] - eb.keys[0]).abs().max()) > 1e-2  # unrotated keys really differ
    assert torch.allclose(ea.values[0], eb.values[0], atol=1e-5)
    backend.store_rpc("drop", [a, b])


def test_identity_reproduces_recompute_and_reuse_loads_the_segments(vllm_run):
    from kvaudit.core.manifest import read_manifest
    from kvaudit.core.run_format import read_pairs

    pairs = read_pairs(vllm_run)
    assert len(pairs) == 5
    for rec in pairs:
        seg = sum(e - s for s, e in rec.segment_spans)
        ident, again = rec.arms["identity"], rec.arms["recompute_again"]
        assert ident.logit_diff_vs_recompute <= 1e-4, rec.case_id
        assert ident.answer_ids == rec.arms["recompute"].answer_ids
        assert again.tokens_reused == 0 and again.logit_diff_vs_recompute <= 1e-4
        for name in ("reuse", "identity"):
            r = rec.arms[name]
            assert r.tokens_reused == seg > 0 and r.tokens_computed == rec.n_prompt_tokens - seg
            assert set(r.segment_kv_fingerprints) == set(rec.segment_ids)
    assert max(p.arms["reuse"].logit_diff_vs_recompute for p in pairs) > 0.05
    # each new head went to the engine with the request that loads it and was copied over in the
    # same engine step: no head request before it (identity, above, loads the head saved there)
    assert all(p.arms[a].head_s == 0 for p in pairs for a in ("reuse", "recompute"))
    steps = read_manifest(vllm_run).backend["head_steps"]
    assert steps.get("same_step", 0) >= 1 and steps.get("step_before", 0) == 0
    probes = [p for p in pairs if p.canary]
    assert probes
    for p in probes:
        names = {p.canary["value"], *p.canary["decoys"]}
        for arm in ("recompute", "reuse"):
            lps = p.arms[arm].canary_logprobs
            assert set(lps) == names and all(v < 0 for v in lps.values())
        # Candidates are scored on each arm's own KV: reuse's moved first-token log-probs by more
        # than 0.05, so its candidate scores must differ from recompute's too.
        rec, reu = p.arms["recompute"].canary_logprobs, p.arms["reuse"].canary_logprobs
        assert max(abs(rec[k] - reu[k]) for k in names) > 1e-2


def test_manifest_records_the_engine(backend, vllm_run):
    from kvaudit.core.manifest import read_manifest

    m = read_manifest(vllm_run)
    assert m.identity.backend == "vllm" and m.status == "complete"
    eng = m.backend["engine"]
    assert eng["enforce_eager"] is True and eng["tensor_parallel_size"] == 1
    # One case at a time is a latency measurement: the engine itself runs without asynchronous
    # scheduling (which would add an engine step to every TTFT), and the manifest says so.
    assert eng["async_scheduling"] is False
    assert backend.llm.llm_engine.vllm_config.scheduler_config.async_scheduling is False
    assert m.backend["vllm"] == vllm.__version__


def test_audit_passes_and_a_tampered_run_fails(vllm_run, tmp_path):
    from kvaudit.audit.audit_cli import audit

    result = audit(vllm_run)
    failed = [c["name"] for c in result["checks"] if c["required"] and not c["passed"]]
    assert result["passed"], failed
    bad = tmp_path / "run"
    shutil.copytree(vllm_run, bad)
    lines = (bad / "pairs.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["arms"]["reuse"]["tokens_reused"] = 0  # a silent zero-hit reuse
    lines[0] = json.dumps(rec)
    (bad / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    tampered = audit(bad)
    assert not tampered["passed"]
    assert {c["name"] for c in tampered["checks"] if not c["passed"]} >= {"reuse_happened"}


def test_prefix_cache_arms_find_what_vllm_cached(backend, vllm_run):
    from kvaudit.audit.audit_cli import audit
    from kvaudit.core.manifest import read_manifest
    from kvaudit.core.run_format import read_pairs

    pairs = read_pairs(vllm_run)
    block = backend.engine_opts["block_size"]
    assert read_manifest(vllm_run).arms[-3:] == ["prefix_cache_cold", "prefix_cache", "recompute_again"]
    for i, rec in enumerate(pairs):
        cold, warm = rec.arms["prefix_cache_cold"], rec.arms["prefix_cache"]
        assert rec.arm_order.index("prefix_cache_cold") + 1 == rec.arm_order.index("prefix_cache")
        assert warm.tokens_reused == warm.cache_hit_tokens == (rec.n_prompt_tokens - 1) // block * block > 0
        assert cold.tokens_reused % block == 0 and cold.tokens_reused < warm.tokens_reused
        if i == 0:
            assert cold.tokens_reused == 0  # nothing on the run's prefix-cache chain yet
        assert cold.logit_diff_vs_recompute <= 1e-3 and warm.logit_diff_vs_recompute <= 1e-3
    checks = {c["name"]: c for c in audit(vllm_run)["checks"]}
    assert "warm vs cold answers differ on" in checks["prefix_cache_control"]["detail"]
    assert "engine prefix cache found prefix_cache" in checks["reuse_happened"]["detail"]


def test_a_warm_prefix_cache_arm_that_found_nothing_fails(vllm_run, tmp_path):
    from kvaudit.audit.audit_cli import audit

    bad = tmp_path / "run"
    shutil.copytree(vllm_run, bad)
    lines = (bad / "pairs.jsonl").read_text().splitlines()
    rec = json.loads(lines[1])
    rec["arms"]["prefix_cache"]["tokens_reused"] = rec["arms"]["prefix_cache"]["cache_hit_tokens"] = 0
    rec["arms"]["prefix_cache"]["tokens_computed"] = rec["n_prompt_tokens"]
    lines[1] = json.dumps(rec)
    (bad / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    result = audit(bad)
    failed = {c["name"]: c for c in result["checks"] if not c["passed"]}
    assert set(failed) == {"reuse_happened"} and failed["reuse_happened"]["failing_cases"] == [rec["case_id"]]


def test_report_compares_transformers_and_vllm_on_the_same_ids(vllm_run, transformers_run):
    """The cross-backend table: the transformers run of the same cases beside the vLLM run."""
    from kvaudit.core.run_format import read_pairs
    from kvaudit.reports.report import write_report

    from .conftest import CONTRACT_CASES

    tf_run = transformers_run
    page = write_report(vllm_run, compare=[tf_run]).read_text()
    summary = json.loads((vllm_run / "summary.json").read_text())
    (x,) = summary["cross_backend"]
    assert (x["a"]["backend"], x["b"]["backend"]) == ("vllm", "transformers")
    assert x["n_common"] == x["ids_equal"] == len(read_pairs(tf_run)) == CONTRACT_CASES and x["same_weights"]
    rows = {r["arm"]: r for r in x["arms"]}
    assert set(rows) == {"recompute", "reuse", "identity", "recompute_again"}  # the arms both ran
    # The same fp32 weights on the same ids: greedy recompute answers agree across engines.
    assert rows["recompute"]["answers_equal"] >= rows["recompute"]["n"] - 1
    assert 'id="cross-backend-1"' in page and "Cross-backend agreement: vllm vs transformers" in page
    assert 'id="batching-note"' not in page  # one case at a time: TTFT is a single request's
    assert summary["run"]["head_steps"]["same_step"] >= 1
    assert 'id="head-steps-note"' in page and "ttft_parts" in summary


def test_candidate_scores_of_recompute_equal_a_full_prefill(backend, dataset, vllm_run):
    """A reuse arm's candidates are scored on its own KV, loaded back for n-1 tokens through the
    connector; recompute's on a fresh prefill (its own KV). Both ways, on KV that is exact, the score
    must equal the one read off a full prefill of prompt + candidate (no cache at all): recompute's in
    the run, and the loaded path's on recompute's KV kept through the connector here."""
    from kvaudit.core.run_format import read_pairs
    from kvaudit.runners.prompt import assemble

    rec = next(p for p in read_pairs(vllm_run) if p.canary)
    case = next(c for c in dataset.cases if c.id == rec.case_id)
    prompt = assemble(case, dataset.segments, backend.tok, backend.max_prompt_tokens)
    n = len(prompt.ids)
    cands = [rec.canary["value"], rec.canary["decoys"][0]]
    key = "tmp:arm:test-loaded-path"
    backend._one(prompt.ids, max_tokens=1, transfer={"save": [[key, 0, n - 1]]})
    loaded = backend._candidates([(prompt, key, cands)])[0]  # raises where fewer than n-1 tokens loaded
    for cand in cands:
        cids = backend.tok.encode(cand)
        full = backend._one(prompt.ids + cids, max_tokens=1, prompt_logprobs=0)
        assert full.num_cached_tokens == 0
        lp = sum(float(full.prompt_logprobs[n + j][t].logprob) for j, t in enumerate(cids))
        assert abs(lp - rec.arms["recompute"].canary_logprobs[cand]) < 1e-3, cand
        assert abs(lp - loaded[cand]) < 1e-3, (cand, lp, loaded[cand])


@pytest.mark.parametrize("tamper, message", [
    (lambda rec: rec["arms"]["prefix_cache_cold"].update(tokens_reused=rec["arms"]["prefix_cache"]["tokens_reused"] + 32,
                                                          cache_hit_tokens=rec["arms"]["prefix_cache"]["tokens_reused"] + 32),
     "fewer than 'prefix_cache_cold'"),
    (lambda rec: rec["arms"]["prefix_cache"].update(cache_hit_tokens=0), "cache_hit_tokens 0 != tokens_reused"),
    (lambda rec: rec["arms"]["prefix_cache_cold"].update(tokens_reused=rec["n_prompt_tokens"],
                                                          cache_hit_tokens=rec["n_prompt_tokens"]),
     "cached tokens for a"),
])
def test_engine_prefix_records_that_cannot_be_true_fail(vllm_run, tmp_path, tamper, message):
    from kvaudit.audit.audit_cli import audit

    bad = tmp_path / "run"
    shutil.copytree(vllm_run, bad)
    lines = (bad / "pairs.jsonl").read_text().splitlines()
    rec = json.loads(lines[2])
    tamper(rec)
    lines[2] = json.dumps(rec)
    (bad / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    check = {c["name"]: c for c in audit(bad)["checks"]}["reuse_happened"]
    assert not check["passed"] and check["failing_cases"] == [rec["case_id"]]
    assert message in check["detail"]


def test_a_run_of_engine_prefix_arms_alone_needs_no_identity_arm(vllm_run, tmp_path):
    """The identity arm vouches for kvaudit's reuse code; vLLM's exact prefix cache is not that code."""
    from kvaudit.audit.audit_cli import audit

    keep = ["recompute", "prefix_cache_cold", "prefix_cache", "recompute_again"]
    bad = tmp_path / "run"
    shutil.copytree(vllm_run, bad)
    recs = [json.loads(line) for line in (bad / "pairs.jsonl").read_text().splitlines()]
    for rec in recs:
        rec["arms"] = {k: v for k, v in rec["arms"].items() if k in keep}
        rec["arm_order"] = [a for a in rec["arm_order"] if a in keep]
    (bad / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["arms"] = manifest["identity"]["arms"] = keep
    (bad / "manifest.json").write_text(json.dumps(manifest))
    checks = {c["name"]: c for c in audit(bad)["checks"]}
    assert checks["identity_control"]["passed"], checks["identity_control"]
    assert checks["records"]["passed"] and checks["reuse_happened"]["passed"]


def test_store_stays_within_its_budget_when_one_prompt_overflows_it(backend, dataset):
    """The worker store, not only the frontend's index, keeps the budget: a prompt whose segments
    need more than the budget is refused up front; if the warm-ups run anyway (the frontend told a
    larger budget), the worker evicts within its own budget, the index forgets what it evicted,
    and the arm says the segments do not fit instead of loading a partial set."""
    from kvaudit.runners.prompt import assemble

    case = max(dataset.cases, key=lambda c: len(c.segment_ids))
    prompt = assemble(case, dataset.segments, backend.tok, backend.max_prompt_tokens)
    units = [len(prompt.unit_ids(i)) for i in range(len(prompt.spans))]
    assert len(units) >= 2
    bpt = backend.bytes_per_token()
    cap = (max(units) + min(units) // 2) * bpt  # holds the largest unit, never all of them
    saved_bytes = backend.store_bytes
    before = backend.store_rpc("capacity", value=cap)
    assert before["bytes"] <= cap and before["bytes_peak"] == before["bytes"]
    backend.sync_store()
    try:
        backend.store_bytes = cap
        saves = before["saves"]
        with pytest.raises(KvauditError, match="do not fit"):
            backend.neutral_entries([prompt])
        assert backend.store_rpc("stats")["saves"] == saves  # refused before any warm-up
        backend.store_bytes = 1 << 40  # the frontend's check out of the way: the worker must hold
        for k in [backend._neutral_key(h) for h in prompt.segment_hashes]:
            backend.cache.entries.pop(k, None)
        with pytest.raises(KvauditError, match="segments needed together after warm-up"):
            backend.neutral_entries([prompt])
        stats = backend.store_rpc("stats")
        assert stats["saves"] >= saves + len(set(prompt.segment_hashes))
        assert stats["evictions"] > before["evictions"]
        assert stats["bytes"] <= cap and stats["bytes_peak"] <= cap
        present = backend.store_rpc("info")
        assert all(k in present for k in backend.cache.entries)  # nothing the worker evicted is indexed
    finally:
        backend.store_bytes = saved_bytes
        backend.store_rpc("capacity", value=saved_bytes)


def test_the_head_is_prefilled_once_and_then_held_by_its_ids(backend, dataset):
    """A new head is prefilled by its own request in the engine step of the request that loads it
    (the connector copies it over layer by layer), and saved; a head seen before is loaded from the
    store (no head request). Both give the same answer and first-token log-probabilities, so the
    same-step copy reached every layer with the head's exact KV."""
    from dataclasses import replace

    from kvaudit.core.arms import IDENTITY_ARM, get_arm
    from kvaudit.runners.prompt import assemble

    case = replace(dataset.cases[0], system=f"Answer from the documents only. Session {id(backend)}.")
    prompt = assemble(case, dataset.segments, backend.tok, backend.max_prompt_tokens)
    spec = get_arm(IDENTITY_ARM)
    [key], new = backend.head_entries([prompt])
    assert list(new) == [key]  # not held yet: it would be prefilled
    before = dict(backend.head_steps)
    first = backend.run_arm(prompt, spec)
    assert backend.head_steps["same_step"] == before.get("same_step", 0) + 1
    assert backend.head_steps.get("step_before", 0) == before.get("step_before", 0)
    again = backend.run_arm(prompt, spec)
    assert first.head_s == 0.0 and again.head_s == 0.0  # no head request went before either
    [held_key], new = backend.head_entries([prompt])
    assert held_key == key and new == {} and key in backend.store_rpc("info", [key])
    assert backend.head_steps["same_step"] == before.get("same_step", 0) + 1  # the held head: no request
    assert first.result.answer_ids == again.result.answer_ids
    # The first time the tail ran in one batch with the head's request, the second time alone: the
    # batch shape moves fp32 sums in their last digits (measured 1e-5 here), nothing more.
    assert [t for t, _ in first.result.top_k] == [t for t, _ in again.result.top_k]
    assert max(abs(a - b) for (_, a), (_, b) in zip(first.result.top_k, again.result.top_k)) < 1e-3


def test_a_head_copied_in_the_same_step_is_the_bytes_its_request_computed(backend):
    """The head's request and a request that loads it go to the engine together: both return
    their first token from one engine step, and the KV the loading request holds at the head's
    positions (saved back out of its own blocks) is bit for bit what the head's request computed
    and saved, in every layer: the copy ran after each layer's KV write and before its attention."""
    import torch

    head = backend.tok.encode("<|im_start|>system\nSame-step copy check " + uuid.uuid4().hex[:8] + ".")
    tail = backend.tok.encode(" Then the question comes, and the answer after it.")
    k_head, k_seen = f"tmp:test:head:{uuid.uuid4().hex[:8]}", f"tmp:test:seen:{uuid.uuid4().hex[:8]}"
    n = len(head)
    head_run, main_run = backend._batch([
        (head, backend._params(max_tokens=1, transfer={"save": [[k_head, 0, n]]}), None),
        (head + tail, backend._params(max_tokens=1, transfer={
            "n_load": n, "plan": [[k_head, 0, False]], "fresh": [k_head], "save": [[k_seen, 0, n]]}), None),
    ])
    assert head_run.first_step == main_run.first_step == 1
    assert main_run.num_cached_tokens == n  # the head came through the connector, not computed again
    got = backend.store_rpc("get", [k_head, k_seen])
    try:
        assert got[k_head].keys.shape[0] == backend.config.num_hidden_layers
        assert torch.equal(got[k_head].keys, got[k_seen].keys)
        assert torch.equal(got[k_head].values, got[k_seen].values)
    finally:
        backend.store_rpc("drop", [k_head, k_seen])


def test_a_load_the_connector_cannot_make_fails_the_arm_loudly(backend):
    """An entry missing from the store fails the request in the engine (vLLM's load-failure policy
    "fail"); the backend raises rather than record whatever the request returned."""
    ids = backend.tok.encode("A prompt whose first tokens name a store entry that does not exist.")
    with pytest.raises(KvauditError, match="failed in the engine"):
        backend._one(ids, max_tokens=1, transfer={"n_load": 5, "plan": [[f"tmp:test:none:{uuid.uuid4().hex}", 0, False]]})


def test_a_request_waits_for_a_head_whose_request_was_cut_into_chunks(backend):
    """When the step's token budget cuts the head's request in two, the request that loads the
    head is not scheduled beside it: it waits (the connector answers vLLM "not yet") until the head
    is saved, then loads it from the store. A one-step copy of half a head never happens."""
    import torch

    budget = backend.engine.vllm_config.scheduler_config.max_num_batched_tokens
    filler = backend.tok.encode(" filler words here" * 2000)[: min(budget, backend.max_prompt_tokens) - 8]
    head = backend.tok.encode("<|im_start|>system\nChunked head check " + uuid.uuid4().hex[:8] + ". " + "Rules. " * 12)
    tail = backend.tok.encode(" The question.")
    n = len(head)
    assert n > budget - len(filler)  # the first step has room for part of the head only
    k_head, k_seen = f"tmp:test:head:{uuid.uuid4().hex[:8]}", f"tmp:test:seen:{uuid.uuid4().hex[:8]}"
    fill_run, head_run, main_run = backend._batch([
        (filler, backend._params(max_tokens=1), None),
        (head, backend._params(max_tokens=1, transfer={"save": [[k_head, 0, n]]}), None),
        (head + tail, backend._params(max_tokens=1, transfer={
            "n_load": n, "plan": [[k_head, 0, False]], "fresh": [k_head], "save": [[k_seen, 0, n]]}), None),
    ])
    # step 1: the filler and the first few head tokens; step 2: the rest of the head (saved), the loader waits;
    # step 3: the loader loads the stored head and computes its tail
    assert (fill_run.first_step, head_run.first_step, main_run.first_step) == (1, 2, 3)
    assert main_run.num_cached_tokens == n
    got = backend.store_rpc("get", [k_head, k_seen])
    try:
        assert torch.equal(got[k_head].keys, got[k_seen].keys)
        assert torch.equal(got[k_head].values, got[k_seen].values)
    finally:
        backend.store_rpc("drop", [k_head, k_seen])


def test_concurrent_cases_run_each_arm_as_one_batch_audit_and_refuse_another_batching(
        backend, dataset, vllm_run, tmp_path):
    """Three cases at a time: each arm's requests for the group ran together (the engine held them
    at once), the run audits as the one-at-a-time run does, its answers match that run's, and a
    resumption with another batching is refused (it changes the numerics)."""
    from kvaudit.audit.audit_cli import audit
    from kvaudit.core.manifest import read_manifest
    from kvaudit.core.run_format import read_pairs
    from kvaudit.reports.report import write_report
    from kvaudit.runners.registry import arms_for
    from kvaudit.runners.runner import RunConfig, execute

    out = tmp_path / "run"
    cfg = RunConfig(dataset=dataset, out=out, arms=arms_for(VLLM_RUN_ARMS, "vllm"), model_name="smollm2")
    backend.concurrent_cases, groups, backend.max_in_flight = 3, dict(backend.groups), 0
    try:
        execute(cfg, backend, progress=False)
    finally:
        backend.concurrent_cases = 1
    m = read_manifest(out)
    assert m.identity.concurrent_cases == 3 and m.backend["batching"]["concurrent_cases"] == 3
    ran = {int(k): v - groups.get(int(k), 0) for k, v in m.backend["batching"]["groups"].items()}
    assert ran.get(3) == len(cfg.arms) and ran.get(2) == len(cfg.arms)  # 5 cases: a group of 3, then of 2
    assert m.backend["batching"]["max_requests_in_flight"] >= 3
    assert all(v >= 0 for v in m.timing_s.values()), m.timing_s
    result = audit(out)
    assert result["passed"], [c["name"] for c in result["checks"] if c["required"] and not c["passed"]]
    seq = {p.case_id: p for p in read_pairs(vllm_run)}
    for p in read_pairs(out):
        for name in ("recompute", "identity", "reuse"):
            assert p.arms[name].answer_ids == seq[p.case_id].arms[name].answer_ids, (p.case_id, name)
        assert p.arms["reuse"].tokens_reused == seq[p.case_id].arms["reuse"].tokens_reused
    with pytest.raises(KvauditError, match="different concurrent_cases"):
        execute(cfg, backend, progress=False)
    page = write_report(out).read_text()
    assert 'id="batching-note"' in page and "Cases ran 3 at a time" in page
