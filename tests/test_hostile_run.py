"""Issue 23, the run and dataset side: hostile input never loses work, never crashes mid-run, and
is refused with exit 2 and one line naming the file and field (each test failed before its fix)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.core.dataset_format import read_dataset
from kvaudit.core.errors import DatasetError
from kvaudit.core.run_dir import RunDir
from kvaudit.core.run_format import read_pairs
from kvaudit.core.run_lock import LOCK_FILE, run_lock
from kvaudit.testing.example_dataset import EXAMPLE, edited_example
from kvaudit.testing.synthetic import make_run

KVAUDIT = [sys.executable, "-m", "kvaudit.cli"]


def _dataset(tmp_path: Path, edit=None, card=None) -> Path:
    return edited_example(tmp_path / "ds", edit, card)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("kvaudit: error: "), err[:300]
    assert len(err) < 1000, len(err)
    return err


# --------------------------------------------------------------------------- 1. resume keeps a finished case


def test_complete_last_record_without_newline_is_kept(tmp_path: Path):
    run = make_run(tmp_path / "run", n_per_task=2)
    pairs = run / "pairs.jsonl"
    raw = pairs.read_bytes()
    n = raw.count(b"\n")
    pairs.write_bytes(raw[:-1])  # the kill came between the record and its newline
    done = RunDir(run).finished()
    assert len(done) == n
    assert pairs.read_bytes() == raw  # the newline is back; nothing was cut


def test_torn_last_record_is_cut_and_rerun(tmp_path: Path):
    run = make_run(tmp_path / "run", n_per_task=2)
    pairs = run / "pairs.jsonl"
    raw = pairs.read_bytes()
    last = raw[: -1].rfind(b"\n") + 1
    pairs.write_bytes(raw[: last + 40])  # killed mid-line
    assert len(RunDir(run).finished()) == raw.count(b"\n") - 1
    assert pairs.read_bytes() == raw[:last]


def test_resume_on_the_real_model_keeps_the_unterminated_case(smollm2_backend, tmp_path: Path, monkeypatch):
    from kvaudit.core.arms import parse_arms
    from kvaudit.core.attestation import KEY_ENV, attestation_key, verify_attestation
    from kvaudit.core.manifest import read_manifest
    from kvaudit.runners.runner import RunConfig, execute

    monkeypatch.setenv(KEY_ENV, "k" * 32)
    out = tmp_path / "run"
    cfg = RunConfig(dataset=read_dataset(EXAMPLE), out=out, arms=parse_arms("recompute,reuse"),
                    model_name="smollm2", limit=2)
    execute(cfg, smollm2_backend, progress=False)
    assert verify_attestation(out, attestation_key()).state == "verified"
    pairs = out / "pairs.jsonl"
    before = pairs.read_bytes()
    pairs.write_bytes(before[:-1])  # `truncate -s -1 RUN/pairs.jsonl`
    manifest = execute(cfg, smollm2_backend, progress=False)
    assert manifest.status == "complete"
    assert manifest.sessions[-1].cases_run == 0  # nothing was lost, so nothing ran again
    assert pairs.read_bytes() == before
    assert [p.case_id for p in read_pairs(out)] == ["ex-01", "ex-02"]
    assert read_manifest(out).status == "complete"
    # the second session re-attested the files it left
    assert verify_attestation(out, attestation_key()).state == "verified"


def test_a_case_recorded_twice_fails_the_audit_and_the_gate_cannot_judge(tmp_path: Path, capsys):
    """What two unlocked writers used to leave: the audit's records check names the case."""
    run = make_run(tmp_path / "run", n_per_task=2)
    pairs = run / "pairs.jsonl"
    lines = pairs.read_text().splitlines()
    with open(pairs, "a") as f:
        f.write(lines[0] + "\n")
    assert main(["audit", str(run)]) == 1
    out = capsys.readouterr().out
    assert "records" in out and json.loads(lines[0])["case_id"] in out
    assert main(["gate", str(run)]) == 2  # the report's reader refuses the duplicate outright


# --------------------------------------------------------------------------- 2. one writer per run directory


_HOLD = """
import sys, time
from kvaudit.core.run_lock import run_lock
with run_lock(sys.argv[1], "run", create=True):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_locked_run_directory_is_refused_before_the_model_loads(tmp_path: Path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.perf_counter()
        code = main(["run", "--dataset", str(EXAMPLE), "--out", str(out), "--no-progress"])
        err = _one_line_error(capsys)
        assert code == 2
        assert "another kvaudit process is writing this run directory" in err and f"pid {holder.pid}" in err
        assert time.perf_counter() - t0 < 5  # refused at once, not after loading a model
        assert main(["audit", str(out)]) == 2
        assert "another kvaudit process" in _one_line_error(capsys)
    finally:
        holder.kill()
        holder.wait()
    # the kernel released the dead holder's lock: no stale lock survives a kill
    with run_lock(out, "test"):
        assert (out / LOCK_FILE).exists()


def test_two_real_runs_on_one_directory_record_each_case_once(smollm2_run: Path, tmp_path: Path):
    """Two `kvaudit run` processes on one --out: the second is refused, the first records every
    case once and its manifest lists its one session."""
    out = tmp_path / "run"
    cmd = [*KVAUDIT, "run", "--dataset", str(EXAMPLE), "--out", str(out), "--arms", "recompute,reuse",
           "--limit", "3", "--max-new-tokens", "8", "--no-progress"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not ((out / LOCK_FILE).exists() and (out / LOCK_FILE).read_text()):
        assert time.time() < deadline and first.poll() is None, first.stderr.read()[-2000:]
        time.sleep(0.1)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert second.returncode == 2, second.stderr[-2000:]
    assert "another kvaudit process" in second.stderr and "Traceback" not in second.stderr
    assert first.wait(timeout=600) == 0, first.stderr.read()[-2000:]
    from kvaudit.core.manifest import read_manifest

    assert [p.case_id for p in read_pairs(out)] == ["ex-01", "ex-02", "ex-03"]
    manifest = read_manifest(out)
    assert manifest.status == "complete" and len(manifest.sessions) == 1


def test_run_files_that_are_symlinks_are_refused(tmp_path: Path, capsys):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text("")
    out = tmp_path / "run"
    out.mkdir()
    (out / "pairs.jsonl").symlink_to(outside)
    assert main(["run", "--dataset", str(EXAMPLE), "--out", str(out), "--no-progress"]) == 2
    assert "is a symbolic link" in _one_line_error(capsys)
    assert outside.read_text() == ""


# --------------------------------------------------------------------------- 5-6. dataset validation


@pytest.mark.parametrize("edit, field", [
    (lambda c: c.update(strata=None), "'strata'"),
    (lambda c: c.update(strata=["a", "b"]), "'strata'"),
    (lambda c: c.update(strata={"hops": [1, 2]}), "'strata.hops'"),
    (lambda c: c.update(canary={"value": "Ann", "decoys": 3}), "'canary.decoys'"),
    (lambda c: c.update(canary={"value": "Ann", "decoys": ["Bo", 7]}), "'canary.decoys'"),
    (lambda c: c.update(canary={"value": "Ann", "capture_prefix": 1}), "'canary.capture_prefix'"),
    (lambda c: c.update(canary={"value": ""}), "'canary'"),
    (lambda c: c.update(evidence=["s00000000000000ff"]), "'segment_ids'"),
    (lambda c: c.update(metric=5), "'metric'"),
])
def test_bad_case_fields_are_refused_before_any_model_loads(tmp_path: Path, capsys, edit, field):
    d = _dataset(tmp_path, edit)
    with pytest.raises(DatasetError, match="cases.jsonl, line 3"):
        read_dataset(d)
    assert main(["run", "--dataset", str(d), "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    err = _one_line_error(capsys)
    assert "cases.jsonl, line 3" in err and field in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("card, message", [
    ({"generator": 123}, "field 'generator' must be str"),
    ({}, "missing field 'generator'"),
    ([], "expected a JSON object"),
    ({"generator": "x", "seed": "zero"}, "field 'seed' must be int"),
    ({"generator": "x", "params": [1]}, "field 'params' must be an object, got list"),
    ({"generator": "x", "content_hash": "0" * 32}, "field 'content_hash'"),
])
def test_bad_dataset_card_is_refused(tmp_path: Path, capsys, card, message):
    d = _dataset(tmp_path, card=card)
    assert main(["run", "--dataset", str(d), "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    err = _one_line_error(capsys)
    assert "dataset.json" in err and message in err


def test_edited_cases_no_longer_match_the_cards_hash(tmp_path: Path):
    d = _dataset(tmp_path, card=(EXAMPLE / "dataset.json").read_text())
    read_dataset(d)  # unchanged: the shipped card's hash holds
    with open(d / "cases.jsonl", "a") as f:
        f.write((EXAMPLE / "cases.jsonl").read_text().splitlines()[0].replace("ex-01", "ex-99") + "\n")
    with pytest.raises(DatasetError, match="content_hash.*changed after the card was written"):
        read_dataset(d)


# --------------------------------------------------------------------------- 7. parser limits


@pytest.mark.parametrize("payload", ["9" * 5000, "[" * 100_000 + "]" * 100_000])
def test_hostile_json_values_are_dataset_errors(tmp_path: Path, capsys, payload):
    d = _dataset(tmp_path)
    lines = (d / "cases.jsonl").read_text().splitlines()
    assert '"hops": 1' in lines[1]
    lines[1] = lines[1].replace('"hops": 1', f'"hops": {payload}', 1)
    (d / "cases.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["run", "--dataset", str(d), "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "cases.jsonl, line 2" in _one_line_error(capsys)

    run = make_run(tmp_path / "run", n_per_task=2)
    pairs = run / "pairs.jsonl"
    text = pairs.read_text().replace('"n_prompt_tokens": ', f'"n_prompt_tokens": {payload}, "x": ', 1)
    pairs.write_text(text)
    assert main(["gate", str(run)]) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "pairs.jsonl, line 1" in out.out + out.err


def test_line_separators_inside_strings_do_not_split_records(tmp_path: Path):
    d = _dataset(tmp_path)
    cases = d / "cases.jsonl"
    lines = cases.read_text(encoding="utf-8").splitlines(keepends=True)
    obj = json.loads(lines[2])
    obj["question"] = "Who\u2028directed\x85 Harrow\x1cPoint?"
    # raw, unescaped in the file: str.splitlines would cut the record at each of them
    lines[2] = json.dumps(obj, ensure_ascii=False) + "\n"
    cases.write_text("".join(lines), encoding="utf-8")
    assert "\u2028" in cases.read_text(encoding="utf-8") and len(cases.read_text(encoding="utf-8").splitlines()) > len(lines)
    assert read_dataset(d).cases[2].question == "Who\u2028directed\x85 Harrow\x1cPoint?"


# --------------------------------------------------------------------------- 8. paths


def test_out_that_is_a_file_is_refused_before_the_model_loads(tmp_path: Path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["run", "--dataset", str(EXAMPLE), "--out", str(f), "--no-progress"]) == 2
    assert "exists and is not a directory" in _one_line_error(capsys)


def test_unwritable_out_is_refused_before_the_model_loads(tmp_path: Path, capsys):
    if os.geteuid() == 0:
        out = Path("/proc/self/kvaudit-run")  # not writable even by root
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        out = ro / "run"
    assert main(["run", "--dataset", str(EXAMPLE), "--out", str(out), "--no-progress"]) == 2
    assert "not writable" in _one_line_error(capsys)


def test_simulate_and_workload_outputs_of_the_wrong_kind(tmp_path: Path, capsys):
    workload = tmp_path / "w.jsonl"
    assert main(["generate", "workload", "--out", str(workload), "--requests", "20", "--documents", "10",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["generate", "workload", "--out", str(tmp_path), "--requests", "20", "--no-progress"]) == 2
    assert "is a directory" in _one_line_error(capsys)
    assert main(["simulate", "--workload", str(workload), "--out", str(workload), "--no-progress"]) == 2
    assert "exists and is not a directory" in _one_line_error(capsys)


def test_generate_does_not_overwrite_a_different_dataset(tmp_path: Path, capsys):
    out = tmp_path / "box"
    args = ["generate", "boxoffice", "--out", str(out), "--cases", "12", "--no-progress"]
    assert main(args + ["--seed", "0"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(args + ["--seed", "0"]) == 0  # the same bytes again: harmless
    assert "unchanged" in capsys.readouterr().out
    assert main(args + ["--seed", "1"]) == 2
    assert "already holds a different dataset" in _one_line_error(capsys)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(args + ["--seed", "1", "--overwrite"]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} != before


# --------------------------------------------------------------------------- 9. smaller


def test_mathtext_in_a_stratum_value_renders_as_text(tmp_path: Path):
    from kvaudit.reports.report import write_report
    from kvaudit.testing.synthetic import make_pairs

    pairs = make_pairs(n_per_task=6)
    for p in pairs:
        p.strata["source"] = "$\\undefinedmacro{$" if p.case_id.endswith(("1", "3")) else "plain"
    run = make_run(tmp_path / "run", pairs)
    html = write_report(run).read_text()
    assert "undefinedmacro" in html


def test_an_unknown_segment_id_is_echoed_cut(tmp_path: Path):
    d = _dataset(tmp_path, lambda c: c.update(segment_ids=["s" + "x" * 1_000_000]))
    with pytest.raises(DatasetError) as e:
        read_dataset(d)
    assert len(str(e.value)) < 400 and "1000001 chars" in str(e.value)


@pytest.mark.parametrize("argv", [
    ["report", "RUN", "--max-cases", "-1"],
    ["run", "--dataset", str(EXAMPLE), "--out", "RUN", "--limit", "-1"],
    ["run", "--dataset", str(EXAMPLE), "--out", "RUN", "--limit", "0"],
    ["generate", "boxoffice", "--out", "X", "--cases", "-5"],
])
def test_negative_counts_are_refused_not_sliced(tmp_path: Path, argv):
    argv = [str(tmp_path / a) if a in ("RUN", "X") else a for a in argv]
    assert main(argv) == 2
    assert not (tmp_path / "RUN").exists() and not (tmp_path / "X").exists()
