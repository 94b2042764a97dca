"""The HTTP backend against upstream llama.cpp's ``llama-server``: an engine nobody here wrote.

llama.cpp caches prompts per slot, reports cached tokens, returns generated ids and top
log-probabilities by id in ``logprobs.content``, bypasses its cache per request with
``cache_prompt: false`` and empties it by erasing its slots; it has no cache salt and echoes no
prompt ids. The audit must say what it cannot see there, never pass it, and never count as cold
what an earlier run left in the cache. Skips (naming ``make test-engines``) where the server is
not built.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.core.run_format import read_pairs

from .http_runs import checks, recorded_replay, run
from .llama_server import llama_server

ARMS = "recompute,prefix_cache_cold,prefix_cache_flushed,prefix_cache,prefix_cache_other_tenant,recompute_again"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("llama_box") / "dataset"
    assert main(["generate", "boxoffice", "--out", str(out), "--cases", "5", "--seed", "4",
                 "--families", "single_doc=3,multi_hop_bridge=2"]) == 0
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with llama_server(tmp_path_factory.mktemp("llama") / "llama-server.log") as url:
        yield url


@pytest.fixture(scope="module")
def two_runs(server, dataset, tmp_path_factory) -> tuple[Path, Path]:
    """The prefix-cache arms twice on the same prompts: the second run meets a cache the first filled."""
    base = tmp_path_factory.mktemp("llama_runs")
    first, second = base / "first", base / "second"
    assert run(server, dataset, first, ARMS) == 0
    assert run(server, dataset, second, ARMS) == 0
    return first, second


def test_llama_cpp_is_probed_as_its_own_dialect(two_runs):
    probe = json.loads((two_runs[0] / "manifest.json").read_text())["backend"]["cache_probe"]
    assert probe["dialect"] == "llama.cpp" and probe["logprobs_keyed_by"] == "token ids" and probe["generated_ids"]
    assert probe["caching"] and not probe["salt_isolates"]  # llama.cpp has no cache salt
    assert probe["bypass"] == "cache_prompt: false on the request" and probe["reset_empties"]
    reasons = json.loads((two_runs[0] / "manifest.json").read_text())["arm_reasons"]
    assert "llama.cpp's per-slot prompt cache" in reasons["prefix_cache_cold"] and "vLLM" not in reasons["prefix_cache_cold"]


def test_cold_is_cold_even_after_an_earlier_run_filled_the_cache(two_runs):
    for run_dir in two_runs:
        for p in read_pairs(run_dir):
            cold = p.arms["prefix_cache_cold"]
            assert cold.tokens_reused == 0 and cold.engine["cache_reset"], p.case_id
            assert p.arms["prefix_cache_flushed"].tokens_reused == 0
            assert p.arms["prefix_cache"].tokens_reused == p.n_prompt_tokens - 1  # all but the last token
            assert p.arms["recompute"].engine["cached_tokens"] == 0  # cache_prompt: false
            assert p.arms["recompute"].engine["prompt_tokens"] == p.n_prompt_tokens


def test_the_audit_says_what_llama_cpp_cannot_show_and_finds_its_shared_cache(two_runs, tmp_path):
    run_dir = two_runs[1]
    code, c = checks(run_dir)
    assert code == 2  # cannot judge: llama.cpp echoes no prompt ids
    assert c["server_consumed_ids"].get("cannot_judge")
    assert "prompt-token counts equal kvaudit's" in c["server_consumed_ids"]["detail"]
    unjudged_or_failed = {k for k, v in c.items() if v["required"] and not v["passed"]}
    assert unjudged_or_failed == {"server_consumed_ids"}, {k: c[k]["detail"] for k in unjudged_or_failed}
    # no salts: another tenant's identical prompt is served from the cache, an honest finding
    assert not c["tenant_isolation"]["passed"] and "5 of 5" in c["tenant_isolation"]["detail"]
    assert main(["report", str(run_dir)]) == 0
    cfw = json.loads((run_dir / "summary.json").read_text())["security"]["cold_flushed_warm"]
    assert cfw["n"] == 5 and sum(cfw["counts"].values()) == 5
    policy = tmp_path / "policy.toml"
    policy.write_text('arm = "prefix_cache"\n[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n'
                      '[audit]\nrequire_passed = true\naccept_cannot_judge = ["server_consumed_ids"]\n'
                      "[security]\nrequire_tenant_isolation = true\n")
    gate = tmp_path / "gate.md"
    assert main(["gate", str(run_dir), "--policy", str(policy), "--markdown", str(gate)]) == 1  # isolation fails
    text = gate.read_text()
    assert "passed except accepted unjudged" in text and "server_consumed_ids" in text


@pytest.mark.parametrize("arms, extra, why", [
    ("recompute,reuse", (), "does not isolate cache_salt"),
    ("recompute,identity", (), "needs --reuse-protocol kvaudit"),
    ("recompute,reuse", ("--reuse-protocol", "kvaudit"), "is not vLLM"),
])
def test_arms_llama_cpp_cannot_run_honestly_are_refused_before_any_case(server, dataset, tmp_path, capsys, arms,
                                                                         extra, why):
    out = tmp_path / "run"
    assert run(server, dataset, out, arms, *extra) == 2
    assert why in capsys.readouterr().err
    assert not (out / "pairs.jsonl").exists()


def test_a_replay_asks_llama_cpp_for_one_log_probability_and_reads_its_ids(server, tmp_path):
    """A replay reads tokens and times only: llama-server shows the generated ids only inside its
    log-probabilities, so each replayed request asks for one (vLLM and SGLang requests ask none),
    and the answers' ids are read from it."""
    recs, replayed, _ = recorded_replay(server, tmp_path)
    assert len(replayed) == 3 and all(b["logprobs"] == 1 for b in replayed)
    assert sum(r.decode_tokens for r in recs) >= 1
