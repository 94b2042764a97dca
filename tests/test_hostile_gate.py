"""Issue #23 (findings 3, 4, 9, 10) and the exit-code contract: 0 pass, 1 a verdict that failed,
2 anything else, never a traceback without ``--debug``.

Each test failed before the fix; the comment above it says how (exit code or traceback).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvaudit import cli as kvaudit_cli
from kvaudit.core.errors import USER_ERRORS, KvauditError
from kvaudit.reports import gate_cli as gate
from kvaudit.reports.policy import ThresholdResult, load_policy, verdict
from kvaudit.reports.synthetic import make_run

NO_LOSS = {"single_doc": 0.0, "multi_hop_bridge": 0.0, "aggregate": 0.0, "agreement": 0.0}
PASSING = dict(n_per_task=100, loss=NO_LOSS, n_docs=40, leak_probes=80)  # as in test_gate.py


def cli(argv: list[str]) -> int:
    """``gate.run`` as tests/test_gate.py calls it (99: a user error escaped the gate)."""
    parser = argparse.ArgumentParser()
    gate.add_arguments(parser)
    try:
        return gate.run(parser.parse_args(argv))
    except USER_ERRORS:
        return 99


@pytest.fixture(scope="module")
def passing(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("pass"), **PASSING)


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    """A planted multi-hop loss that fails its threshold, and only 10 leak probes: the text-leak
    rate cannot be judged."""
    return make_run(tmp_path_factory.mktemp("fail"), n_per_task=150, n_docs=40, leak_probes=10)


def policy(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line(err: str) -> str:
    """stderr of a contract-keeping failure: a single line, no traceback."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------- finding 3: vacuous pass


def test_a_gate_whose_every_threshold_was_skipped_cannot_pass(passing, tmp_path, capsys):
    """Before: exit 0 (PASS) with every row skipped."""
    p = policy(tmp_path, '[[delta]]\ngroup = "task:no_such_family_*"\nmin_lower_bound = -2.0\nmissing = "skip"\n')
    assert cli([str(passing), "--policy", str(p)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("## kvaudit gate: ⚠️ CANNOT JUDGE")
    assert "| thresholds checked | ⚠️ cannot judge | 0 of 1 decided (1 skipped)" in out
    assert "the gate checked nothing" in out


def test_completeness_and_noise_rows_do_not_count_as_thresholds_checked():
    rows = [ThresholdResult("run complete", "completeness", "pass", "", ""),
            ThresholdResult("x: noise floor", "noise_control", "pass", "", ""),
            ThresholdResult("x", "delta", "skip", "", "")]
    assert verdict(rows) == "error"
    assert verdict(rows + [ThresholdResult("audit passed", "audit", "pass", "", "")]) == "pass"
    assert verdict([]) == "error"


# ---------------------------------------------------------------- finding 4: crashes


@pytest.mark.parametrize("text, field", [
    ('[[delta]]\ngroup = "overall"\nmin_lower_bound = nan\n', "delta[0].min_lower_bound"),  # ValueError, exit 1
    ('[[delta]]\ngroup = "overall"\nmin_lower_bound = inf\n', "delta[0].min_lower_bound"),
    ('[[delta]]\ngroup = "overall"\nmin_lower_bound = -inf\n', "delta[0].min_lower_bound"),  # passed (exit 0)
    ("confidence = nan\n[audit]\n", "field 'confidence'"),
    ("[hit_rate]\nmin = nan\n", "hit_rate.min"),
    ("[leak]\nmax_neutral_text_leak_rate = nan\n", "leak.max_neutral_text_leak_rate"),
    ("[security]\nmax_timing_auc = nan\n", "security.max_timing_auc"),
])
def test_non_finite_numbers_are_refused(passing, tmp_path, capsys, text, field):
    p = policy(tmp_path, text, "bad.toml")
    with pytest.raises(KvauditError, match="bad.toml") as e:
        load_policy(p)
    assert field in str(e.value) and "finite" in str(e.value)
    assert cli([str(passing), "--policy", str(p)]) == 2
    assert field in capsys.readouterr().out


def test_the_reference_arm_cannot_be_the_arm_under_test(passing, tmp_path, capsys):
    """Before: a traceback (ValueError from matmul in the interval) and exit 1; with only an
    [audit] section, exit 0 for an 'arm under test' compared with itself."""
    for text in ('arm = "recompute"\n[[delta]]\ngroup = "overall"\nmin_lower_bound = -2\n',
                 'arm = "recompute"\n[audit]\n'):
        p = policy(tmp_path, text)
        assert cli([str(passing), "--policy", str(p)]) == 2
        out = capsys.readouterr().out
        assert "field 'arm'" in out and "cannot be its own reference" in out


@pytest.mark.parametrize("option", ["--junit", "--markdown"])
def test_an_unwritable_report_file_is_exit_2_before_anything_is_printed(passing, tmp_path, capsys, option):
    """Before: PASS printed, then a traceback (IsADirectoryError) and exit 1."""
    target = tmp_path / "a-directory"
    target.mkdir()
    assert cli([str(passing), option, str(target)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no verdict printed for a gate that could not write its report
    line = one_line(err)
    assert line.startswith(f"kvaudit: error: {target}: ") and option in line


def test_report_files_are_written_before_printing(passing, tmp_path, monkeypatch):
    xml, md = tmp_path / "g.xml", tmp_path / "g.md"

    def broken_print(*args, **kwargs):
        assert xml.exists() and md.exists()
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("builtins.print", broken_print)
    assert cli([str(passing), "--junit", str(xml), "--markdown", str(md)]) == 0


def _kvaudit() -> list[str]:
    exe = Path(sys.executable).with_name("kvaudit")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "kvaudit.cli"]


@pytest.mark.parametrize("run, code", [("passing", 0), ("failing", 1)])
@pytest.mark.parametrize("reader", ["head -1", "closed at once"])
def test_a_reader_that_stops_early_keeps_the_files_and_the_verdict(request, tmp_path, run, code, reader):
    """`kvaudit gate RUN | head -1`. Before: a BrokenPipeError traceback and exit 1, also for a
    passing run. Now the files are complete, stderr is empty and the exit code is the verdict's."""
    xml = tmp_path / "gate.xml"
    proc = subprocess.Popen([*_kvaudit(), "gate", str(request.getfixturevalue(run)), "--junit", str(xml)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if reader == "head -1":
        assert proc.stdout.readline().startswith(b"## kvaudit gate:")
    proc.stdout.close()  # the reader goes away (closed at once: before the gate writes a byte)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == code, err
    assert err == ""
    assert xml.read_text().rstrip().endswith("</testsuites>")


# ---------------------------------------------------------------- finding 9: policy bounds and booleans


@pytest.mark.parametrize("text, field", [
    ("[hit_rate]\nmin = -1\n", "hit_rate.min"),  # before: accepted, every run passed it (exit 0)
    ("[hit_rate]\nmin = 1.5\n", "hit_rate.min"),
    ("[leak]\nmax_neutral_text_leak_rate = 2\n", "leak.max_neutral_text_leak_rate"),  # before: traceback
    ("[leak]\nmax_neutral_text_leak_rate = -0.5\n", "leak.max_neutral_text_leak_rate"),
    ('[audit]\nrequire_passed = "no"\n', "audit.require_passed"),  # before: read as yes
    ('[leak]\nforbid_neutral_exposure = "no"\n', "leak.forbid_neutral_exposure"),  # before: read as yes
    ("[leak]\nforbid_neutral_exposure = 1\n", "leak.forbid_neutral_exposure"),
    ('[[delta]]\ngroup = "overall"\nmin_lower_bound = 150\n', "delta[0].min_lower_bound"),
    ('[hit_rate]\nmin = 0.5\nkey = 3\n', "hit_rate.key"),
    ('[audit]\naccept_cannot_judge = ["no_such_check"]\n', "audit.accept_cannot_judge"),  # a typo waives nothing
    ('[audit]\naccept_cannot_judge = "server_consumed_ids"\n', "audit.accept_cannot_judge"),
])
def test_policy_bounds_and_switches_are_validated(passing, tmp_path, capsys, text, field):
    p = policy(tmp_path, text, "bad.toml")
    with pytest.raises(KvauditError, match="bad.toml") as e:
        load_policy(p)
    assert field in str(e.value)
    assert cli([str(passing), "--policy", str(p)]) == 2
    assert field in capsys.readouterr().out


def test_valid_switches_still_work(tmp_path):
    p = load_policy(policy(tmp_path, "[audit]\nrequire_passed = false\n[hit_rate]\nmin = 0\n"
                                      "[leak]\nmax_neutral_text_leak_rate = 1\nforbid_neutral_exposure = false\n"))
    assert [c.kind for c in p.checks] == ["hit_rate", "leak_text"]


def test_an_unknown_field_name_is_cut_in_the_message(tmp_path):
    with pytest.raises(KvauditError) as e:
        load_policy(policy(tmp_path, f"{'x' * 5000} = 1\n"))
    assert len(str(e.value)) < 200


# ---------------------------------------------------------------- finding 10: fail outranks cannot judge


def test_a_failed_threshold_fails_even_beside_rows_that_cannot_be_judged(failing, capsys):
    """Before: exit 2 (cannot judge) because the text-leak row could not be judged."""
    assert cli([str(failing)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("## kvaudit gate: ❌ FAIL")
    assert "| multi-hop quality | ❌ fail |" in out
    assert "| neutral-policy text leak rate | ⚠️ cannot judge |" in out  # still listed


def test_a_tenant_isolation_or_timing_failure_is_a_fail():
    """Before: 'error' (exit 2) as soon as any other row could not be judged."""
    fail = ThresholdResult("tenant isolation", "tenant_isolation", "fail", "hit", "no hit")
    unjudged = ThresholdResult("timing side channel", "timing", "error", "", "")
    assert verdict([fail, unjudged]) == "fail"
    assert verdict([ThresholdResult("timing side channel", "timing", "fail", "", ""), unjudged]) == "fail"
    assert verdict([ThresholdResult("audit passed", "audit", "pass", "", ""), unjudged]) == "error"
    assert gate.EXIT[verdict([fail, unjudged])] == 1


# ---------------------------------------------------------------- the exit-code contract (kvaudit.cli.main)


def test_a_policy_that_is_a_directory_is_exit_2_without_traceback(passing, tmp_path, capsys):
    """Before: a traceback (IsADirectoryError) and exit 1."""
    assert kvaudit_cli.main(["gate", str(passing), "--policy", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and err == ""
    assert "⚠️ CANNOT JUDGE" in out and "cannot read the policy file" in out


def test_main_reports_an_unwritable_junit_in_one_line(passing, tmp_path, capsys):
    assert kvaudit_cli.main(["gate", str(passing), "--junit", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and one_line(err).startswith(f"kvaudit: error: {tmp_path}: ")


def test_an_os_error_in_any_command_is_one_line_naming_the_path(passing, monkeypatch, capsys):
    def read_only(args):
        raise PermissionError(13, "Permission denied", "/read-only/report.html")

    monkeypatch.setattr(gate, "run", read_only)
    assert kvaudit_cli.main(["gate", str(passing)]) == 2
    assert one_line(capsys.readouterr().err) == "kvaudit: error: /read-only/report.html: Permission denied"


def test_an_internal_error_is_one_line_and_debug_shows_it(passing, monkeypatch, capsys):
    def broken(args):
        raise ValueError("boom " * 200)

    monkeypatch.setattr(gate, "run", broken)
    assert kvaudit_cli.main(["gate", str(passing)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("kvaudit: internal error: ValueError: boom boom")
    assert line.endswith("(rerun with --debug for the traceback)") and len(line) < 420
    with pytest.raises(ValueError, match="boom"):
        kvaudit_cli.main(["--debug", "gate", str(passing)])
    with pytest.raises(ValueError, match="boom"):
        kvaudit_cli.main(["gate", str(passing), "--debug"])


def test_a_long_user_error_is_cut(passing, monkeypatch, capsys):
    def bad(args):
        raise KvauditError("bad input: " + "x" * 5000)

    monkeypatch.setattr(gate, "run", bad)
    assert kvaudit_cli.main(["gate", str(passing)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("kvaudit: error: bad input: xxx") and len(line) <= 520


def test_debug_flag_is_global_and_after_the_command():
    parse = lambda argv: kvaudit_cli.build_parser(argv).parse_args(argv)  # noqa: E731
    assert parse(["gate", "RUN"]).debug is False
    assert parse(["--debug", "gate", "RUN"]).debug is True
    assert parse(["gate", "RUN", "--debug"]).debug is True


def test_a_broken_pipe_before_a_code_is_2_and_quiet(passing, monkeypatch, capsys):
    def pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(gate, "run", pipe)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # no file descriptor: taken as stdout gone
    assert kvaudit_cli.main(["gate", str(passing)]) == 2
    assert capsys.readouterr().err == ""


def test_stdout_closed_tells_a_gone_reader_from_a_live_one(monkeypatch):
    read, write = os.pipe()
    with open(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert kvaudit_cli.stdout_closed() is False
        os.close(read)
        assert kvaudit_cli.stdout_closed() is True
        monkeypatch.undo()


def test_ctrl_c_is_still_130(passing, monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(gate, "run", interrupted)
    assert kvaudit_cli.main(["gate", str(passing)]) == 130
    assert "interrupted" in capsys.readouterr().err


# ---------------------------------------------------------------- finding 11: provenance

KEY = "a-ci-secret-of-32-characters-xyz"
PROVENANCE = '[audit]\nrequire_passed = true\n\n[provenance]\nrequire_attestation = true\n'


@pytest.fixture
def attested(tmp_path, monkeypatch):
    """A passing synthetic run signed as `kvaudit run` signs, and the CI's key in the environment."""
    from kvaudit.core.attestation import KEY_ENV, attest

    run = make_run(tmp_path / "run", n_per_task=20, loss=NO_LOSS, n_docs=12, leak_probes=0)
    monkeypatch.setenv(KEY_ENV, KEY)
    attest(run, KEY.encode(), {"tool": "kvaudit run", "kvaudit_version": "test", "git_revision": None})
    return run


def test_an_attested_run_passes_the_provenance_row(attested, tmp_path, capsys):
    assert cli([str(attested), "--policy", str(policy(tmp_path, PROVENANCE))]) == 0
    assert "signed by `kvaudit run`" in capsys.readouterr().out


@pytest.mark.parametrize("edit", ["dtype", "answer"])
def test_an_edit_before_the_audit_cannot_pass(attested, tmp_path, capsys, edit):
    """Before: edit, re-audit, and the gate passed (the dtype edit loosens the identity tolerance)."""
    import json

    if edit == "dtype":
        m = attested / "manifest.json"
        m.write_text(m.read_text().replace('"float32"', '"bfloat16"'))
    else:
        p = attested / "pairs.jsonl"
        lines = p.read_text().splitlines()
        rec = json.loads(lines[0])
        rec["arms"]["reuse"]["answer"] = rec["arms"]["recompute"]["answer"] + " (edited)"
        lines[0] = json.dumps(rec, sort_keys=True)
        p.write_text("\n".join(lines) + "\n")
    assert kvaudit_cli.main(["audit", str(attested)]) in (0, 1)  # the audit judges the edited files
    capsys.readouterr()
    assert cli([str(attested), "--policy", str(policy(tmp_path, PROVENANCE))]) == 2
    assert "changed after `kvaudit run` attested it" in capsys.readouterr().out


def test_missing_attestation_missing_key_and_another_key_cannot_pass(attested, tmp_path, monkeypatch, capsys):
    from kvaudit.core.attestation import ATTESTATION_FILE, KEY_ENV

    p = str(policy(tmp_path, PROVENANCE))
    monkeypatch.setenv(KEY_ENV, "another-secret-of-enough-length!")
    assert cli([str(attested), "--policy", p]) == 2
    assert "signed with another key" in capsys.readouterr().out
    monkeypatch.delenv(KEY_ENV)
    assert cli([str(attested), "--policy", p]) == 2
    assert f"{KEY_ENV} is not set" in capsys.readouterr().out
    monkeypatch.setenv(KEY_ENV, KEY)
    sig = attested / ATTESTATION_FILE
    forged = sig.read_text().replace('"kvaudit_version": "test"', '"kvaudit_version": "forged"')
    sig.write_text(forged)
    assert cli([str(attested), "--policy", p]) == 2
    assert "signature does not match" in capsys.readouterr().out
    sig.unlink()
    assert cli([str(attested), "--policy", p]) == 2
    assert "the run was not attested" in capsys.readouterr().out
    monkeypatch.setenv(KEY_ENV, "short")
    assert kvaudit_cli.main(["gate", str(attested), "--policy", p]) == 2
    assert "at least 16 bytes" in capsys.readouterr().out


def test_without_the_policy_field_no_attestation_is_asked_for(attested, tmp_path):
    from kvaudit.core.attestation import ATTESTATION_FILE

    (attested / ATTESTATION_FILE).unlink()
    assert cli([str(attested), "--policy", str(policy(tmp_path, "[audit]\nrequire_passed = true\n"))]) == 0
