"""kvaudit export: inspect-ai eval logs (read back with inspect-ai's own reader) and
lm-evaluation-harness results files (checked against the layout lm-eval's readers use), on
synthetic runs (no model)."""

from __future__ import annotations

import builtins
import contextlib
import json
import re
import resource
from pathlib import Path

import pytest

from kvaudit import cli
from kvaudit.core.jsonio import read_json, write_json
from kvaudit.reports.analysis import Analysis, load_run
from kvaudit.testing.synthetic import make_run

SESSIONS = [{"started": "2026-01-02T03:04:05+0000", "finished": "2026-01-02T04:05:06+0000"}]


@pytest.fixture
def run_dir(tmp_path) -> Path:
    d = make_run(tmp_path / "run", n_per_task=6, leak_probes=3)
    manifest = read_json(d / "manifest.json")
    manifest["sessions"] = SESSIONS
    write_json(d / "manifest.json", manifest)
    return d


def _export(run: Path, fmt: str, out: Path, capsys) -> tuple[int, str, str]:
    code = cli.main(["export", str(run), "--format", fmt, "--out", str(out)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


# --------------------------------------------------------------------------- inspect-ai


def test_inspect_log_opens_with_read_eval_log(run_dir, tmp_path, capsys):
    pytest.importorskip("inspect_ai")
    from inspect_ai.log import list_eval_logs, read_eval_log

    code, out, err = _export(run_dir, "inspect", tmp_path / "logs", capsys)
    assert code == 0, err
    (path,) = (tmp_path / "logs").iterdir()
    assert path.name == f"{path.name.split('_')[0]}_kvaudit-synthetic_{path.name.split('_')[2]}"
    assert path.name.startswith("2026-01-02T03-04-05+00-00_") and path.suffix == ".eval"
    assert str(path) in out and "inspect view" in out
    # inspect's own log listing finds it and reads the task back from the file name
    (info,) = list_eval_logs(str(tmp_path / "logs"))
    assert info.task == "kvaudit-synthetic"

    log = read_eval_log(str(path))
    an = Analysis(load_run(run_dir))
    pairs = {p.case_id: p for p in an.run.pairs}
    assert log.status == "success" and log.eval.model == "synthetic/synthetic"
    assert log.eval.task_args["arms"] == an.arms
    assert log.eval.metadata["kvaudit_manifest"]["sessions"] == SESSIONS
    assert log.eval.dataset.samples == len(pairs) == len(log.samples)
    assert log.stats.started_at.startswith("2026-01-02T03:04:05")
    for s in log.samples:
        p = pairs[s.id]
        assert s.output.completion == p.arms["recompute"].answer
        assert set(s.metadata["arms"]) == set(p.arms)
        for arm, a in p.arms.items():
            assert s.metadata["arms"][arm]["answer"] == a.answer
        if p.task == "leak_probe":
            assert s.scores is None  # not an answer-quality case: answers, no scores
            continue
        assert list(s.scores) == [a for a in an.arms if a in p.arms]
        for arm, score in s.scores.items():
            assert score.answer == p.arms[arm].answer
            assert score.value == pytest.approx(an.rows[(p.case_id, arm)]["score"])
            if arm != "recompute":
                assert score.metadata["flip"] == (p.arms[arm].answer != p.arms["recompute"].answer)
    scores = {s.name: s for s in log.results.scores}
    assert list(scores) == an.arms
    reuse = scores["reuse"].metrics
    assert reuse["delta_pts"].value == pytest.approx(an.delta("reuse").delta)
    assert reuse["flip_rate"].value == pytest.approx(an.flips("reuse").rate)
    assert reuse["hit_rate"].value == pytest.approx(an.hit_rate("reuse"))
    overall = list(an.select("overall"))
    assert scores["recompute"].metrics["mean"].value == pytest.approx(
        sum(an.rows[(c, "recompute")]["score"] for c in overall) / len(overall))
    assert log.results.completed_samples == len(pairs)


def test_inspect_json_file_and_header(run_dir, tmp_path, capsys):
    pytest.importorskip("inspect_ai")
    from inspect_ai.log import read_eval_log

    out = tmp_path / "deep" / "run.json"
    assert _export(run_dir, "inspect", out, capsys)[0] == 0
    assert json.loads(out.read_text())["eval"]["task"] == "kvaudit-synthetic"
    head = read_eval_log(str(out), header_only=True)
    assert head.samples is None and [s.name for s in head.results.scores][:2] == ["recompute", "reuse"]


def test_missing_inspect_ai_is_a_clear_error(run_dir, tmp_path, capsys, monkeypatch):
    real = builtins.__import__

    def no_inspect(name, *args, **kwargs):
        if name == "inspect_ai" or name.startswith("inspect_ai."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_inspect)
    code, _, err = _export(run_dir, "inspect", tmp_path / "logs", capsys)
    assert code == 2 and "Traceback" not in err
    assert "--format inspect needs inspect-ai" in err and "pip install 'kvaudit[inspect]'" in err
    assert not (tmp_path / "logs").exists()
    # lm-eval needs nothing of it
    assert _export(run_dir, "lm-eval", tmp_path / "lm", capsys)[0] == 0


# --------------------------------------------------------------------------- lm-eval

# what lm-eval's EvaluationTracker.save_results_aggregated writes (lm_eval/result_schema.py)
LM_EVAL_KEYS = {"results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
                "n-samples", "config", "git_hash", "date", "model_source", "model_name",
                "model_name_sanitized", "system_instruction", "system_instruction_sha",
                "fewshot_as_multiturn", "chat_template", "chat_template_sha", "task_hashes",
                "total_evaluation_time_seconds"}
SAMPLE_KEYS = {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter",
               "metrics", "doc_hash", "prompt_hash", "target_hash"}


# lm_eval.utils' readers of an output folder, as lm-eval 0.4 writes them
def _task_of(filename: str) -> str:  # lm_eval.utils.get_file_task_name
    return filename[filename.find("_") + 1: filename.rfind("_")]


def _datetime_of(filename: str) -> str:  # lm_eval.utils.get_file_datetime
    return filename[filename.rfind("_") + 1:].replace(".jsonl", "")


def test_lm_eval_results_layout(run_dir, tmp_path, capsys):
    import hashlib

    code, out, err = _export(run_dir, "lm-eval", tmp_path / "lm", capsys)
    assert code == 0, err
    folder = tmp_path / "lm" / "synthetic"  # output_path / model_name_sanitized
    files = sorted(str(f) for f in folder.iterdir())
    results_files = [f for f in files if "/results_" in f and ".json" in f]
    sample_files = [f for f in files if "/samples_" in f and ".json" in f]
    assert len(results_files) == 1 and results_files[0] in out
    stamp = "2026-01-02T04-05-06"  # the run's last session time, as lm-eval formats datetimes
    assert Path(results_files[0]).name == f"results_{stamp}.json"
    assert {_datetime_of(Path(f).name) for f in sample_files} == {stamp}
    an = Analysis(load_run(run_dir))
    tasks = {f"kvaudit_{t}" for t in an.tasks}
    assert {_task_of(Path(f).name) for f in sample_files} == tasks

    r = json.loads(Path(results_files[0]).read_text())
    assert LM_EVAL_KEYS <= set(r)
    assert set(r["results"]) == tasks | {"kvaudit"} and set(r["groups"]) == {"kvaudit"}
    assert set(r["group_subtasks"]["kvaudit"]) == tasks - {"kvaudit_agreement"}
    for name, metrics in r["results"].items():
        assert metrics["alias"] == name and isinstance(metrics["sample_len"], int)
        assert name in r["versions"] and name in r["n-shot"] and name in r["higher_is_better"]
        for key, value in metrics.items():
            if key in ("alias", "name", "sample_len"):
                continue
            metric, _, arm = key.partition(",")  # lm-eval keys are "metric,filter"
            assert arm in an.arms, key
            if value == "N/A":  # lm-eval's marker for a standard error it cannot compute, and only that
                assert metric == "score_stderr", key
            else:
                assert isinstance(value, (float, int)) and not isinstance(value, bool), key
            if not metric.endswith("_stderr"):
                assert metric in r["higher_is_better"][name]
    for t in tasks:
        assert r["n-samples"][t] == {"original": r["results"][t]["sample_len"],
                                     "effective": r["results"][t]["sample_len"]}
        assert r["configs"][t]["task"] == t and r["configs"][t]["output_type"] == "generate_until"
    d = an.delta("reuse", "task:multi_hop_bridge")
    assert r["results"]["kvaudit_multi_hop_bridge"]["delta_pts,reuse"] == pytest.approx(d.delta)
    assert r["config"]["model"] == "kvaudit-synthetic" and r["model_name_sanitized"] == "synthetic"

    for f in sample_files:
        rows = [json.loads(x) for x in Path(f).read_text().splitlines()]
        task = _task_of(Path(f).name)
        cases = {x["doc"]["case_id"] for x in rows}
        assert len(rows) == sum(len(p.arms) for p in an.run.pairs if p.case_id in cases)
        for x in rows:
            assert SAMPLE_KEYS <= set(x) and x["filter"] in an.arms
            assert isinstance(x["doc_id"], int) and isinstance(x["target"], str)
            assert x["resps"] == [[an.run.pairs[[p.case_id for p in an.run.pairs].index(
                x["doc"]["case_id"])].arms[x["filter"]].answer]]
            assert x["score"] == pytest.approx(an.rows[(x["doc"]["case_id"], x["filter"])]["score"])
            assert all(isinstance(x[m], float) for m in x["metrics"])
        joined = "".join(x["doc_hash"] + x["prompt_hash"] + x["target_hash"] for x in rows)
        assert r["task_hashes"][task] == hashlib.sha256(joined.encode()).hexdigest()
    # the same run exported again writes the same names and bytes
    first = Path(results_files[0]).read_bytes()
    assert _export(run_dir, "lm-eval", tmp_path / "lm", capsys)[0] == 0
    assert sorted(str(f) for f in folder.iterdir()) == files
    assert Path(results_files[0]).read_bytes() == first


def test_lm_eval_make_table_reads_it(run_dir, tmp_path, capsys):
    """lm-eval's own table printer, when lm-eval is installed (it is not a kvaudit extra)."""
    utils = pytest.importorskip("lm_eval.utils")
    pytest.importorskip("pytablewriter")
    assert _export(run_dir, "lm-eval", tmp_path / "lm", capsys)[0] == 0
    (f,) = (tmp_path / "lm" / "synthetic").glob("results_*.json")
    table = utils.make_table(json.loads(f.read_text()))
    assert re.search(r"kvaudit_single_doc\s*\|", table) and "reuse" in table


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("fmt", ["inspect", "lm-eval"])
def test_bad_run_directory_is_a_clear_error(tmp_path, capsys, fmt):
    if fmt == "inspect":
        pytest.importorskip("inspect_ai")
    code, _, err = _export(tmp_path / "nope", fmt, tmp_path / "o", capsys)
    assert code == 2 and "run directory not found" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    code, _, err = _export(tmp_path / "empty", fmt, tmp_path / "o", capsys)
    assert code == 2 and "manifest.json" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_lm_eval_out_must_be_a_folder(run_dir, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, _, err = _export(run_dir, "lm-eval", tmp_path / "file", capsys)
    assert code == 2 and "writes a folder" in err


# --------------------------------------------------------------------------- issue 38, finding 6


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Writes past ``nbytes`` fail with EFBIG, a real write error naming no file (as ENOSPC does);
    Python ignores SIGXFSZ, so the write returns the error instead of killing the process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _tasks_run(tmp_path: Path, tasks: list[str]) -> Path:
    return make_run(tmp_path / "run", n_per_task=4, leak_probes=0, loss={t: 0.2 for t in tasks})


def test_lm_eval_tasks_that_sanitise_alike_are_not_merged(tmp_path, capsys):
    """Before: `qa-hard` and `qa.hard` both became kvaudit_qa_hard: one result overwrote the
    other and both tasks' samples went into one file."""
    run = _tasks_run(tmp_path, ["qa-hard", "qa.hard", "qa_hard"])
    code, _, err = _export(run, "lm-eval", tmp_path / "lm", capsys)
    assert code == 0, err
    folder = tmp_path / "lm" / "synthetic"
    r = json.loads(next(folder.glob("results_*.json")).read_text())
    names = [t for t in r["results"] if t != "kvaudit"]
    assert len(names) == 3 and "kvaudit_qa_hard" in names
    samples = sorted(folder.glob("samples_*.jsonl"))
    assert len(samples) == 3
    seen = set()
    for f in samples:
        tasks = {json.loads(x)["doc"]["task"] for x in f.read_text().splitlines()}
        assert len(tasks) == 1 and _task_of(f.name) in names
        seen |= tasks
    assert seen == {"qa-hard", "qa.hard", "qa_hard"}
    assert {r["configs"][t]["description"] for t in names} == {
        f"kvaudit task family {t!r}: each filter is an arm of the run" for t in seen}


def test_lm_eval_long_task_name_is_cut_with_a_hash(tmp_path, capsys):
    """Before: a 300-character task name exited 2 (file name too long) after the results file
    and folder were written."""
    long_a, long_b = "x" * 300, "x" * 299 + "y"
    run = _tasks_run(tmp_path, [long_a, long_b])
    code, _, err = _export(run, "lm-eval", tmp_path / "lm", capsys)
    assert code == 0, err
    files = list((tmp_path / "lm" / "synthetic").iterdir())
    assert len(files) == 3 and all(len(f.name.encode()) <= 255 for f in files)
    samples = [f for f in files if f.name.startswith("samples_")]
    assert len({_task_of(f.name) for f in samples}) == 2


def test_lm_eval_export_that_fails_leaves_no_new_folder(run_dir, tmp_path, capsys):
    out = tmp_path / "new" / "lm"
    with file_size_limit(2000):
        code, _, err = _export(run_dir, "lm-eval", out, capsys)
    assert code == 2 and "Traceback" not in err
    assert "File too large" in err and str(out / "synthetic") in err  # names the file it was writing
    assert not (tmp_path / "new").exists()
    # an existing folder keeps exactly what it had
    out.mkdir(parents=True)
    (out / "keep.txt").write_text("x")
    with file_size_limit(2000):
        assert _export(run_dir, "lm-eval", out, capsys)[0] == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_inspect_long_task_name_and_failed_write_leave_nothing(tmp_path, capsys):
    pytest.importorskip("inspect_ai")
    run = _tasks_run(tmp_path, ["qa"])
    manifest = read_json(run / "manifest.json")
    manifest["dataset"]["name"] = "g" * 300
    manifest["sessions"] = SESSIONS
    write_json(run / "manifest.json", manifest)
    code, out, err = _export(run, "inspect", tmp_path / "logs", capsys)
    assert code == 0, err
    (path,) = (tmp_path / "logs").iterdir()
    assert len(path.name.encode()) <= 255
    with file_size_limit(2000):
        code, _, err = _export(run, "inspect", tmp_path / "new" / "logs", capsys)
    assert code == 2 and "Traceback" not in err and str(tmp_path / "new" / "logs") in err
    assert not (tmp_path / "new").exists()
    with file_size_limit(2000):
        code, _, err = _export(run, "inspect", tmp_path / "f" / "run.eval", capsys)
    assert code == 2 and str(tmp_path / "f" / "run.eval") in err
    assert not (tmp_path / "f").exists()
