"""Serving changes (kvaudit run --engines): the engines file's errors, a real numerics change on SmolLM2
(float32 against bfloat16) audited, reported and gated on quality and speed, and an undeclared
difference between the engines failing the audit by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.reports.gate import judge

from .conftest import EXAMPLE

BASE = """
[baseline]
backend = "transformers"
model = "smollm2"
dtype = "float32"
max_new_tokens = 4
"""
CANDIDATE = """
[candidate]
backend = "transformers"
model = "smollm2"
dtype = "bfloat16"
max_new_tokens = 4
change = "bfloat16 weights and activations"
declares = ["dtype"]
"""
POLICY = """
arm = "candidate"
[[delta]]
group = "overall"
min_lower_bound = -5.0
[[speed]]
name = "TTFT no worse than 1.5x"
metric = "ttft"
max_ratio = 1.5
[[speed]]
name = "decode 100x faster"
metric = "time_per_output_token"
min_speedup = 100
[audit]
require_passed = true
"""


def write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def run(engines: Path, out: Path, *extra: str) -> int:
    return main(["run", "--dataset", str(EXAMPLE), "--engines", str(engines), "--out", str(out),
                 "--no-progress", *extra])


@pytest.mark.parametrize("text, says", [
    (BASE, "no [candidate] table"),
    (BASE + CANDIDATE.replace('declares = ["dtype"]', ""), "declares must list"),
    (BASE + CANDIDATE.replace('change = "bfloat16 weights and activations"', ""), "change must say"),
    (BASE + CANDIDATE.replace('"bfloat16"', '"float32"'), "are the same configuration"),
    (BASE + CANDIDATE.replace('backend = "transformers"', 'backend = "sglang"'), "[candidate] backend must be"),
    (BASE + CANDIDATE + "[candidate.options]\nkv_cache_dtype = \"fp8\"\n", "unknown option 'kv_cache_dtype'"),
    (BASE + "change = \"x\"\n" + CANDIDATE, "only [candidate] says what it changes"),
    (BASE + CANDIDATE + "[extra]\n", "unknown table 'extra'"),
    ("[baseline\n", "not valid TOML"),
])
def test_a_bad_engines_file_is_refused_naming_the_file_and_key(tmp_path, capsys, text, says):
    engines = write(tmp_path, "engines.toml", text)
    assert run(engines, tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert str(engines) in err and says in err, err
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_engine_flags_beside_engines_and_candidate_arms_without_them_are_refused(tmp_path, capsys):
    engines = write(tmp_path, "engines.toml", BASE + CANDIDATE)
    assert run(engines, tmp_path / "a", "--dtype", "bfloat16") == 2
    assert "--dtype and --engines" in capsys.readouterr().err
    assert run(engines, tmp_path / "b", "--arms", "recompute,recompute_again") == 2
    assert "names no arm of the candidate engine" in capsys.readouterr().err
    assert main(["run", "--dataset", str(EXAMPLE), "--out", str(tmp_path / "c"), "--arms", "recompute,candidate"]) == 2
    assert "give --engines" in capsys.readouterr().err


def test_undeclared_names_every_difference_the_change_did_not_declare():
    from kvaudit.runners.serving_change import undeclared

    base = {"dtype": "float32", "engine.seed": 0, "engine.kv_cache_dtype": "auto", "engine.max_model_len": 4096}
    cand = {**base, "engine.kv_cache_dtype": "fp8", "engine.seed": 1, "engine.max_model_len": 8192}
    assert undeclared(base, cand, ["kv_cache_dtype"]) == ["engine.max_model_len", "engine.seed"]
    assert undeclared(base, cand, ["kv_cache_dtype", "seed", "engine.max_model_len"]) == []
    assert undeclared(base, {**base, "vllm": "0.27"}, ["kv_cache_dtype"]) == ["vllm"]  # a key only one side has
    # a nested option (the H200 ngram run recorded speculative_config's fields one key each)
    spec = {**base, "engine.speculative_config.method": "ngram", "engine.speculative_config.num_speculative_tokens": 4}
    assert undeclared(base, spec, ["speculative_config"]) == []
    assert undeclared(base, spec, ["engine.speculative_config"]) == []
    assert undeclared(base, spec, ["engine"]) == list(sorted(set(spec) - set(base)))  # a namespace covers nothing
    assert undeclared(base, spec, ["method"]) == ["engine.speculative_config.num_speculative_tokens"]
    # a KV space written as the opener's kv_cache_bytes is recorded by vLLM as kv_cache_memory_bytes:
    # either name declares it (the recipe's kv_cache_memory_bytes failed a table that set kv_cache_bytes)
    half = {**base, "options.kv_cache_bytes": 1 << 29, "engine.kv_cache_memory_bytes": 1 << 29}
    full = {**base, "engine.kv_cache_memory_bytes": 1 << 30}
    for name in ("kv_cache_memory_bytes", "kv_cache_bytes"):
        assert undeclared(full, half, [name]) == []
    assert undeclared(full, half, ["kv_cache_dtype"]) == ["engine.kv_cache_memory_bytes", "options.kv_cache_bytes"]


def test_in_process_vllm_engines_of_one_run_share_one_connector():
    """vLLM keeps one KV connector a process (measured on the CPU: a reuse arm on the baseline beside a
    candidate engine answered from the candidate's cache). So, before any engine: tables that mix
    engines with and without kvaudit's connector are refused, and so are arms that load KV through it
    beside a second in-process vLLM engine; one vLLM engine in process (the other over HTTP) is not
    limited."""
    from kvaudit.core.errors import KvauditError
    from kvaudit.runners.engines_file import EngineSpec
    from kvaudit.runners.serving_change import check_one_connector

    def spec(role: str, backend: str = "vllm", **options) -> EngineSpec:
        return EngineSpec(role, backend, "smollm2", options=options)

    bare = {"segment_connector": False}
    with pytest.raises(KvauditError, match="the candidate table.s. set segment_connector = false and the others"):
        check_one_connector("e.toml", {"baseline": spec("baseline"), "candidate": spec("candidate", **bare)},
                            ["recompute", "candidate"])
    two = {"baseline": spec("baseline"), "candidate": spec("candidate", seed=1)}
    with pytest.raises(KvauditError, match="--arms reuse, reuse_first_user with e.toml: these arms load KV"):
        check_one_connector("e.toml", two, ["recompute", "reuse", "reuse_first_user", "prefix_cache", "candidate"])
    for specs, arms in ((two, ["recompute", "recompute_again", "candidate", "candidate_again", "prefix_cache"]),
                        ({"baseline": spec("baseline", **bare), "candidate": spec("candidate", **bare)},
                         ["recompute", "candidate"]),
                        ({"baseline": spec("baseline"), "candidate": spec("candidate", "openai")},
                         ["recompute", "reuse", "candidate"])):
        check_one_connector("e.toml", specs, arms)


@pytest.fixture(scope="module")
def change_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("serving_change")
    engines = write(tmp, "engines.toml", BASE + CANDIDATE)
    out = tmp / "run"
    assert run(engines, out, "--limit", "6",
               "--arms", "recompute,candidate,candidate_off,candidate_again,recompute_again") == 0
    return out


def test_a_numerics_change_is_measured_and_its_controls_hold(change_run, tmp_path, capsys):
    assert main(["audit", str(change_run)]) == 0
    checks = {c["name"]: c for c in json.loads((change_run / "audit.json").read_text())["checks"]}
    assert checks["engines_differ_only_in_change"]["passed"]
    assert "only in dtype" in checks["engines_differ_only_in_change"]["detail"]
    # the candidate with its change off is the baseline: bit-equal on this CPU
    assert checks["candidate_control"]["passed"] and "answers differ on 0 of 6" in checks["candidate_control"]["detail"]
    assert "max first-token difference 0;" in checks["candidate_control"]["detail"]
    # bfloat16 moves the first-token logits (measured, not zero), and reuse checks do not pretend to pass
    pairs = [json.loads(line) for line in (change_run / "pairs.jsonl").read_text().splitlines()]
    assert min(p["arms"]["candidate"]["logit_diff_vs_recompute"] for p in pairs) > 0.05
    for name in ("identity_control", "reuse_happened", "leak_probes", "coverage"):
        assert checks[name].get("not_applicable") and checks[name]["detail"].startswith("does not apply")
    manifest = json.loads((change_run / "manifest.json").read_text())
    assert manifest["serving_change"]["configurations"]["candidate"]["dtype"] == "bfloat16"
    assert manifest["serving_change"]["configurations"]["candidate_off"]["dtype"] == "float32"

    # the gate (6 cases: the fewest a 95% interval of a median has): quality cannot be decided; the 1.5x TTFT bound is measured; a 100x decode
    # speed-up is not shown, so that row fails and the gate with it (exit 1)
    policy = write(tmp_path, "policy.toml", POLICY)
    assert main(["gate", str(change_run), "--policy", str(policy)]) == 1
    judged = judge(change_run, policy)
    verdict, results = judged.verdict, judged.results
    rows = {r.name: r for r in results}
    assert verdict == "fail" and rows["decode 100x faster"].status == "fail"
    assert rows["TTFT no worse than 1.5x"].status in ("pass", "fail")
    assert "timing noise: recompute_again/recompute" in rows["TTFT no worse than 1.5x"].detail


def test_the_report_and_the_exporters_read_a_serving_change_run(change_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(change_run, run_dir)
    assert main(["audit", str(run_dir)]) == 0
    assert main(["report", str(run_dir)]) == 0
    html = (run_dir / "report.html").read_text()
    assert 'id="serving-change"' in html and "bfloat16 weights and activations" in html
    assert "does not apply" in html
    assert main(["export", str(run_dir), "--format", "lm-eval", "--out", str(tmp_path / "lm")]) == 0
    # compare and plan take the serving-change policy's arm (candidate), not reuse's, without --policy
    assert main(["compare", str(run_dir), str(change_run), "--out", str(tmp_path / "cmp")]) == 0
    cmp = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert cmp["arms"] == ["candidate"] and not cmp["skipped"]
    capsys.readouterr()
    # plan reads the pilot under the candidate arm (under reuse it found no scored pair and said so);
    # six unchanged answers are too few to make a design from, which it says naming the threshold
    assert main(["plan", "--from", str(run_dir), "--reps", "20"]) == 2
    err = capsys.readouterr().err
    assert "'reuse'" not in err and "threshold 'overall quality'" in err, err


def test_an_undeclared_difference_fails_the_audit_naming_it(tmp_path, capsys):
    # the candidate decodes fewer tokens than the baseline (a longer prompt limit), and the change says nothing of it
    engines = write(tmp_path, "engines.toml", BASE + CANDIDATE.replace("max_new_tokens = 4", "max_new_tokens = 3"))
    out = tmp_path / "run"
    assert run(engines, out, "--limit", "1", "--arms", "recompute,candidate") == 0
    capsys.readouterr()
    assert main(["audit", str(out)]) == 1
    text = capsys.readouterr().out
    assert "engines_differ_only_in_change" in text and "decoding.max_new_tokens: 4 vs 3" in text
    # resuming with another engines file is refused, not mixed, before any engine starts
    other = write(tmp_path, "other.toml", BASE + CANDIDATE)
    assert run(other, out, "--limit", "2", "--arms", "recompute,candidate") == 2
    captured = capsys.readouterr()
    assert "engines_sha256" in captured.err and "Loading weights" not in captured.err


@pytest.mark.parametrize("row, says", [
    ('metric = "ttft"\n', "needs exactly one of max_ratio"),
    ('metric = "ttft"\nmax_ratio = 1.05\nmin_speedup = 1.3\n', "needs exactly one of max_ratio"),
    ('metric = "tpot"\nmax_ratio = 1.05\n', "field 'speed[0].metric' must be one of"),
    ('metric = {}\nmax_ratio = 1.05\n', "field 'speed[0].metric' must be one of"),  # was a TypeError (fuzzer)
    ('metric = "ttft"\nmax_ratio = 0\n', "field 'speed[0].max_ratio' must be in"),
    ('metric = "ttft"\nmax_ratio = 1.05\nbound = 2\n', "speed[0]: unknown"),
])
def test_a_bad_speed_row_is_refused_naming_the_file_and_field(tmp_path, row, says):
    from kvaudit.core.errors import KvauditError
    from kvaudit.reports.policy import load_policy

    p = write(tmp_path, "policy.toml", 'arm = "candidate"\n[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n'
              "[[speed]]\n" + row)
    with pytest.raises(KvauditError, match="policy.toml") as e:
        load_policy(p)
    assert says in str(e.value), str(e.value)
