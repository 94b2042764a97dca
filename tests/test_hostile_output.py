"""Issue 38, finding 8: what kvaudit prints and writes when run files are hostile or the disk is
full. File content reaches the terminal escaped; a long unbroken string cannot widen the report
page; a write error names its file; `kvaudit report` writes its files all or none; out-of-range
numbers are refused; a gate policy error also goes to stderr."""

from __future__ import annotations

import contextlib
import re
import resource
from pathlib import Path

import pytest

from kvaudit import cli
from kvaudit.core.errors import cut, printable
from kvaudit.core.progress import progress_bar, progress_print
from kvaudit.core.run_dir import RunDir
from kvaudit.core.run_lock import LOCK_FILE
from kvaudit.runners.run_summary import print_run_summary
from kvaudit.testing.synthetic import make_pairs, make_run

FAKE = "\x1b[2J\x1b[H\x1b[32maudit PASSED\x1b[0m\r\u202e"


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Writes past ``nbytes`` fail with EFBIG, a real write error that names no file (as
    ENOSPC does); Python ignores SIGXFSZ, so the write returns the error."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _no_controls(text: str) -> None:
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", text), repr(text)


def _hostile_run(tmp_path: Path, case_id: str = "case" + FAKE, **kwargs) -> Path:
    pairs = make_pairs(n_per_task=5, leak_probes=0)
    pairs[0].case_id = case_id
    pairs[0].arms["reuse"].answer = "answer" + FAKE
    return make_run(tmp_path / "run", pairs, **kwargs)


# ---------------------------------------------------------------- file content on the terminal


def test_printable_escapes_control_characters_and_keeps_text():
    assert printable("a\x1b[31mb\nc\td\u202e") == "a\\x1b[31mb\\nc\\td\\u202e"
    assert printable("Zoë 東京 ok") == "Zoë 東京 ok"
    assert cut("line one\nline \x1b[2J two") == "line one line \\x1b[2J two"


def test_audit_prints_case_ids_escaped(tmp_path, capsys):
    """Before: the failing case's id reached the terminal raw and could paint "audit PASSED"."""
    run = _hostile_run(tmp_path, audit_passed=False)
    assert cli.main(["audit", str(run)]) == 1
    out, err = capsys.readouterr()
    _no_controls(out + err)
    assert "failing cases: case\\x1b[2J\\x1b[H\\x1b[32maudit PASSED" in out
    assert "audit FAILED" in out


def test_run_summary_prints_case_ids_and_answers_escaped(tmp_path, capsys):
    run = _hostile_run(tmp_path, case_id=FAKE + "x")
    print_run_summary(run, RunDir(run).read_manifest())
    out = capsys.readouterr().out
    _no_controls(out)
    assert "\\x1b[2J" in out and "answer\\x1b[2J" in out


def test_error_lines_and_progress_lines_are_escaped(tmp_path, capsys):
    assert cli.main(["audit", str(tmp_path / f"no{FAKE}where")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no\\x1b[2J" in err
    _no_controls(err)
    progress_print(progress_bar(total=1, enabled=False), f"{FAKE} done")
    err = capsys.readouterr().err
    _no_controls(err)
    assert err.endswith(" done\n")


# ---------------------------------------------------------------- report.html


def test_long_unbroken_strings_wrap_in_the_report(tmp_path):
    """Before: a 5,000-character case id made report.html 45,000 px wide."""
    long_id = "c" * 5000
    run = _hostile_run(tmp_path, case_id=long_id)
    assert cli.main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert long_id in page
    style = page[page.index("<style>"): page.index("</style>")]
    assert re.search(r"(^|\n)\s*body \{[^}]*overflow-wrap: anywhere", style), style[:300]
    assert re.search(r"select \{[^}]*max-width: 100%", style)


# ---------------------------------------------------------------- write errors


def test_a_full_disk_names_the_file_and_report_writes_all_or_nothing(tmp_path, capsys):
    """Before: `File too large` (or `No space left on device`) without a path, and a new
    summary.json beside the old report.html."""
    run = make_run(tmp_path / "run", n_per_task=8, leak_probes=0)
    assert cli.main(["report", str(run)]) == 0
    capsys.readouterr()
    files = RunDir(run)
    old = {p: p.read_bytes() for p in (files.report_file, files.samples_file)}
    files.summary_file.unlink()
    small = max(len(b) for b in old.values()) // 2  # the summary fits, the page does not
    with file_size_limit(small):
        code = cli.main(["report", str(run), "--near-tie", "2.5"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith(f"kvaudit: error: {run}/") and err.rstrip().endswith("File too large")
    assert not files.summary_file.exists()
    assert {p: p.read_bytes() for p in old} == old
    assert [p.name for p in run.iterdir() if p.name.startswith(".") and p.name != LOCK_FILE] == []


def test_appended_pairs_name_their_file_when_the_disk_is_full(tmp_path):
    run = make_run(tmp_path / "run", n_per_task=2, leak_probes=0)
    files = RunDir(run)
    pairs = files.read_pairs()
    size = files.pairs_file.stat().st_size
    with pytest.raises(OSError) as e, file_size_limit(size + 10), files.appending() as out:
        out.append(pairs[0])
        out.flush()
    assert e.value.filename == str(files.pairs_file) and "File too large" in cli.os_error_message(e.value)


# ---------------------------------------------------------------- options and the gate


@pytest.mark.parametrize("command", ["report", "export"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "-inf"])
def test_near_tie_out_of_range_is_refused(tmp_path, capsys, command, value):
    run = make_run(tmp_path / "run", n_per_task=2, leak_probes=0)
    extra = ["--format", "lm-eval", "--out", str(tmp_path / "o")] if command == "export" else []
    before = sorted(p.name for p in run.iterdir())
    assert cli.main([command, str(run), *extra, f"--near-tie={value}"]) == 2
    err = capsys.readouterr().err
    assert "--near-tie" in err and "finite number, 0 or more" in err and value in err
    assert sorted(p.name for p in run.iterdir()) == before and not (tmp_path / "o").exists()


def test_a_gate_policy_error_also_goes_to_stderr(tmp_path, capsys):
    run = make_run(tmp_path / "run", n_per_task=2, leak_probes=0)
    assert cli.main(["gate", str(run), "--policy", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "CANNOT JUDGE" in out and "cannot read the policy file" in out
    assert err.startswith("kvaudit: error: ") and err.count("\n") == 1
    assert "cannot read the policy file" in err
