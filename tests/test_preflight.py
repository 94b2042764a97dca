"""Issue 38, findings 8-10: bad sizes and work that cannot fit are refused before any work, with
exit 2 and one line naming the option or the file (each test failed before its fix)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.core.arg_types import parse_size
from kvaudit.core.errors import KvauditError
from kvaudit.replay.serve import RequestKV, check_waves_fit
from kvaudit.testing.example_dataset import edited_example

# --------------------------------------------------------------------------- 9. one size parser


def test_sizes_in_every_unit():
    assert parse_size("30GB") == 30 * 10**9
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size(" 1.5 tib ") == int(1.5 * 2**40)
    assert parse_size("500mb") == 500 * 10**6
    assert parse_size("4096") == parse_size("4096B") == 4096
    assert parse_size(".5KB") == 500


@pytest.mark.parametrize("bad", ["inf", "-inf", "nan", "Infinity", "-1GB", "0", "0.4B", "1e9", "2G", "GB",
                                 "", "30 parsecs", "1,000MB", "9" * 400 + "TB", "99999999TB"])
def test_a_size_that_is_not_positive_finite_bytes_is_refused(bad):
    with pytest.raises(KvauditError):
        parse_size(bad)


@pytest.mark.parametrize("argv, option", [
    (["run", "--dataset", "no-such-dir", "--out", "{tmp}/r", "--cache-budget", "inf"], "--cache-budget"),
    (["run", "--dataset", "no-such-dir", "--out", "{tmp}/r", "--cache-budget=-1GB"], "--cache-budget"),
    (["run", "--dataset", "no-such-dir", "--out", "{tmp}/r", "--cache-budget", "nan"], "--cache-budget"),
    (["replay", "--workload", "no-such.jsonl", "--cache-policy", "segment", "--out", "{tmp}/p",
      "--cache-budget", "inf"], "--cache-budget/--budget"),
    # the old names are still accepted, and still checked
    (["replay", "--workload", "no-such.jsonl", "--policy", "segment", "--out", "{tmp}/p", "--budget", "0MB"],
     "--cache-budget/--budget"),
    (["simulate", "--workload", "no-such.jsonl", "--out", "{tmp}/s", "--cache-budget", "30GB,inf"],
     "--cache-budget/--capacity"),
    (["simulate", "--workload", "no-such.jsonl", "--out", "{tmp}/s", "--capacity=-3GB"], "--cache-budget/--capacity"),
])
def test_every_size_option_refuses_a_bad_size_naming_the_option(tmp_path, capsys, argv, option):
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"argument {option}: '" in err and "size" in err, err[-400:]


# --------------------------------------------------------------------------- 8. a case that cannot fit the model


def test_a_case_longer_than_the_model_is_refused_before_the_first_case(tmp_path: Path, capsys):
    from kvaudit.core.manifest import read_manifest
    from kvaudit.core.run_format import read_pairs

    # the third case's question alone is longer than SmolLM2's 8K context
    d = edited_example(tmp_path / "ds", lambda c: c.update(question="Who directed it? " + "Answer briefly. " * 3000))
    out = tmp_path / "run"
    argv = ["run", "--dataset", str(d), "--out", str(out), "--arms", "recompute,reuse", "--limit", "3",
            "--max-new-tokens", "4", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1].startswith("kvaudit: error: "), err[-400:]
    assert f"{d / 'cases.jsonl'}: 1 case(s) cannot fit" in err and "'ex-03'" in err
    assert "--skip-unfit-cases" in err
    assert not (out / "pairs.jsonl").exists()  # ex-01 and ex-02 did not run first
    # a sequential run checks every case its design may take before its first look
    seq = tmp_path / "seq"
    assert main(["run", "--dataset", str(d), "--out", str(seq), "--arms", "recompute,reuse", "--until-decided",
                 "--max-cases", "8", "--no-progress"]) == 2
    assert "1 case(s) cannot fit" in capsys.readouterr().err
    assert not (seq / "pairs.jsonl").exists()
    assert main(["run", "--dataset", str(d), "--out", str(seq), "--until-decided", "--max-cases", "8",
                 "--skip-unfit-cases"]) == 2
    assert "a sequential run cannot leave cases out" in capsys.readouterr().err

    # left out explicitly: run, named in the manifest, and missing for the gate
    assert main(argv + ["--skip-unfit-cases"]) == 0
    assert "leaving out 1 case(s) that cannot fit the model: ex-03" in capsys.readouterr().err
    assert [p.case_id for p in read_pairs(out)] == ["ex-01", "ex-02"]
    manifest = read_manifest(out)
    assert manifest.status == "partial" and manifest.dataset.n_cases == 3
    assert list(json.loads((out / "manifest.json").read_text())["dataset"]["unfit_cases"]) == ["ex-03"]
    assert main(["gate", str(out)]) == 2  # cannot pass with a case left out
    assert "ex-03" in capsys.readouterr().out


# --------------------------------------------------------------------------- 10. a replay wave over the budget


def test_the_wave_check_counts_shared_documents_once_and_names_what_fits():
    kvs = [RequestKV({"a": 100, "b": 100}), RequestKV({"a": 100, "c": 50}), RequestKV({"d": 100}),
           RequestKV({"e": 10})]
    ids = ["r0", "r1", "r2", "r3"]
    common = {"open_loop": False, "bytes_per_token": 10}
    check_waves_fit(kvs, ids, concurrency=2, store_bytes=2500, budget=2500, **common)  # 250 tokens, a shared
    with pytest.raises(KvauditError) as e:
        check_waves_fit(kvs, ids, concurrency=4, store_bytes=2500, budget=2500, **common)
    msg = str(e.value)
    assert "'r0' to 'r3'" in msg and "360 tokens (3,600 B)" in msg
    assert "--cache-budget 3600 or more or --concurrency 2" in msg
    check_waves_fit(kvs, ids, concurrency=4, store_bytes=3600, budget=3600, **common)  # the advice holds
    # open loop: any two neighbours may be served together; on two workers the budget is doubled
    with pytest.raises(KvauditError, match=r"'r0' to 'r1', which may arrive together.*--cache-budget 5000 or more or --concurrency 1$"):
        check_waves_fit(kvs, ids, concurrency=2, open_loop=True, bytes_per_token=10, store_bytes=2400,
                        budget=4800)


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wl") / "w.jsonl"
    assert main(["generate", "workload", "--out", str(out), "--requests", "14", "--documents", "8",
                 "--queries", "5", "--docs-per-request", "2", "--doc-tokens", "uniform:30:70",
                 "--prefix-tokens", "12", "--question-tokens", "fixed:6", "--no-progress"]) == 0
    return out


def test_a_segment_replay_whose_wave_overflows_the_budget_is_refused_before_any_request(workload, tmp_path, capsys):
    out = tmp_path / "seg"
    # 8 MB holds 173 tokens of SmolLM2's fp32 KV: one request's two documents, not four requests'
    assert main(["replay", "--workload", str(workload), "--policy", "segment", "--budget", "8MB",
                 "--concurrency", "4", "--limit", "4", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1].startswith("kvaudit: error: "), err[-400:]
    assert "--cache-budget 8,000,000 B cannot hold the segment KV of the wave of requests 'r0000000' to 'r0000003'" in err
    assert "nothing was replayed" in err and "or --concurrency" in err
    assert not (out / "requests.jsonl").exists() and not (out / "replay_config.json").exists()
