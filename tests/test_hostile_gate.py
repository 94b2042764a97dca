"""Issue #23 (findings 3, 4, 9, 10) and the exit-code contract: 0 pass, 1 a verdict that failed,
2 anything else, never a traceback without ``--debug``; issue #38 (a gate that cannot be talked
into a pass) at the end.

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
from kvaudit.testing.synthetic import make_run

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
    assert "| quality checked | ⚠️ cannot judge | 0 of 1 quality thresholds decided (1 skipped)" in out
    assert "the gate did not check quality" in out


def test_only_a_decided_quality_row_counts_as_checked():
    """Issue 38, finding 1: completeness, noise-floor, audit and provenance rows are not quality."""
    rows = [ThresholdResult("run complete", "completeness", "pass", "", ""),
            ThresholdResult("x: noise floor", "noise_control", "pass", "", ""),
            ThresholdResult("x", "delta", "skip", "", "")]
    assert verdict(rows) == "error"
    assert verdict(rows + [ThresholdResult("audit passed", "audit", "pass", "", "")]) == "error"  # before: pass
    assert verdict(rows + [ThresholdResult("run attested by kvaudit run", "provenance", "pass", "", "")]) == "error"
    assert verdict(rows + [ThresholdResult("y", "delta", "pass", "", "")]) == "pass"
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
    p = load_policy(policy(tmp_path, '[[delta]]\ngroup = "overall"\nmin_lower_bound = -2\n'
                                      "[audit]\nrequire_passed = false\n[hit_rate]\nmin = 0\n"
                                      "[leak]\nmax_neutral_text_leak_rate = 1\nforbid_neutral_exposure = false\n"))
    assert [c.kind for c in p.checks] == ["delta", "hit_rate", "leak_text"]


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
    assert "Traceback" not in out + err
    assert err.startswith("kvaudit: error: ") and err.count("\n") == 1  # issue 38: stderr too
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
QUALITY = '[[delta]]\ngroup = "overall"\nmin_lower_bound = -60.0\n'  # decided on the small runs below
PROVENANCE = QUALITY + '[audit]\nrequire_passed = true\n\n[provenance]\nrequire_attestation = true\n'


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
    assert cli([str(attested), "--policy", str(policy(tmp_path, QUALITY + "[audit]\nrequire_passed = true\n"))]) == 0


# ---------------------------------------------------------------- issue 38: a gate that cannot be talked into a pass

# Reuse turns 65% of the correct answers wrong: it loses about 42 points. The shipped policy fails it.
LOSER = dict(n_per_task=40, loss={"single_doc": 0.65, "multi_hop_bridge": 0.65, "aggregate": 0.65}, n_docs=40,
             leak_probes=0)
LENIENT = '[[delta]]\ngroup = "overall"\nmin_lower_bound = -60.0\n'  # the 42-point loss passes it (bound about -51)
SIGNED = "[provenance]\nrequire_attestation = true\n"


def _sign(run: Path) -> None:
    from kvaudit.core.attestation import attest

    attest(run, KEY.encode(), {"tool": "kvaudit run", "kvaudit_version": "test", "git_revision": None})


@pytest.fixture
def signed_loser(tmp_path, monkeypatch):
    """A signed run whose reuse arm loses 42 points, and the CI's key in the environment."""
    from kvaudit.core.attestation import KEY_ENV

    run = make_run(tmp_path / "loser", **LOSER)
    monkeypatch.setenv(KEY_ENV, KEY)
    _sign(run)
    return run


def test_the_signed_loser_fails_the_shipped_policy(signed_loser, capsys):
    from kvaudit.reports.analysis import Analysis, load_run

    assert Analysis(load_run(signed_loser)).delta("reuse").delta < -40
    assert cli([str(signed_loser)]) == 1
    assert "| overall quality | ❌ fail |" in capsys.readouterr().out


# finding 1: provenance (or any other precondition) is no quality threshold


@pytest.mark.parametrize("text", [SIGNED, "[audit]\nrequire_passed = true\n" + SIGNED,
                                  "[hit_rate]\nmin = 0.5\n[security]\nrequire_tenant_isolation = true\n"])
def test_a_policy_without_a_quality_threshold_is_refused(signed_loser, tmp_path, capsys, text):
    """Before: `[provenance] require_attestation = true` alone passed the 42-point loser (exit 0, one row)."""
    p = policy(tmp_path, text, "noquality.toml")
    with pytest.raises(KvauditError, match="noquality.toml") as e:
        load_policy(p)
    assert "no [[delta]] thresholds" in str(e.value) and "[provenance]" in str(e.value)
    assert cli([str(signed_loser), "--policy", str(p)]) == 2
    assert "sets no threshold on quality" in capsys.readouterr().out


def test_skipped_quality_beside_provenance_cannot_pass(signed_loser, tmp_path, capsys):
    """Before: `missing = "skip"` on an absent group plus [provenance] passed (exit 0)."""
    p = policy(tmp_path, '[[delta]]\ngroup = "task:no_such_family_*"\nmin_lower_bound = -2.0\nmissing = "skip"\n'
               + SIGNED)
    assert cli([str(signed_loser), "--policy", str(p)]) == 2
    out = capsys.readouterr().out
    assert "| run attested by kvaudit run | ✅ pass |" in out
    assert "| quality checked | ⚠️ cannot judge | 0 of 1 quality thresholds decided (1 skipped)" in out


def test_a_decided_quality_threshold_beside_provenance_passes(signed_loser, tmp_path):
    assert cli([str(signed_loser), "--policy", str(policy(tmp_path, LENIENT + SIGNED))]) == 0


# finding 2: simulation.json decides a row only when the audit and the attestation bind it

SIMULATED = LENIENT + '[hit_rate]\nmin = 0.5\nsource = "simulated"\nkey = "segment @ 30GB"\n'


def _simulation(run: Path, rate: object) -> None:
    """Write the cache simulator's results into ``run``; ``rate`` is JSON text (``NaN`` included)."""
    entry = '{"policy": "segment", "capacity": "30GB", "token_hit_rate": ' + str(rate) + "}"
    (run / "simulation.json").write_text('{"results": [' + entry + "]}")


def test_an_unbound_simulation_cannot_decide_the_hit_rate_row(signed_loser, tmp_path, capsys):
    """Before: 57.0 written into the run passed under require_attestation, showing "5700.0%"."""
    p = str(policy(tmp_path, SIMULATED + SIGNED))
    _simulation(signed_loser, "57.0")
    assert cli([str(signed_loser), "--policy", p]) == 2
    out = capsys.readouterr().out
    assert "5700" not in out
    assert "| reuse simulated token hit rate | ⚠️ cannot judge | not bound to the run |" in out
    assert "records no sha256 for it" in out and "re-run `kvaudit audit" in out
    # bound by the audit, but not signed by `kvaudit run`
    assert kvaudit_cli.main(["audit", str(signed_loser)]) == 0
    capsys.readouterr()
    assert cli([str(signed_loser), "--policy", p]) == 2
    assert "is not in the run's attestation" in capsys.readouterr().out
    # bound and signed, the rate is read and refused: the file and the field are named
    _sign(signed_loser)  # `kvaudit run` rerun: it resumes, runs nothing and signs the files there now
    assert cli([str(signed_loser), "--policy", p]) == 2
    out = capsys.readouterr().out
    assert "simulation.json: field 'results[0].token_hit_rate' must be a rate in [0, 1], got 57" in out
    # a plausible rate, bound and signed
    _simulation(signed_loser, "0.6")
    assert kvaudit_cli.main(["audit", str(signed_loser)]) == 0
    _sign(signed_loser)
    capsys.readouterr()
    assert cli([str(signed_loser), "--policy", p]) == 0
    assert "| reuse simulated token hit rate | ✅ pass | 60.0% |" in capsys.readouterr().out
    # edited after both: the audit's hash and the signature no longer hold
    _simulation(signed_loser, "0.61")
    assert cli([str(signed_loser), "--policy", p]) == 2
    assert "changed after the audit" in capsys.readouterr().out
    assert cli([str(signed_loser), "--policy", str(policy(tmp_path, LENIENT + SIGNED))]) == 2
    assert "simulation.json changed after `kvaudit run` attested it" in capsys.readouterr().out


def test_an_audit_without_the_simulation_binding_still_reads(signed_loser, tmp_path, capsys):
    """An audit.json written before the binding existed: the run reads, the simulated row cannot judge."""
    import json

    _simulation(signed_loser, "0.6")
    assert kvaudit_cli.main(["audit", str(signed_loser)]) == 0
    audit = json.loads((signed_loser / "audit.json").read_text())
    del audit["inputs"]["simulation.json"]
    (signed_loser / "audit.json").write_text(json.dumps(audit))
    capsys.readouterr()
    assert cli([str(signed_loser)]) == 1  # the shipped policy: read and judged as before
    assert "| audit passed | ✅ pass |" in capsys.readouterr().out
    assert cli([str(signed_loser), "--policy", str(policy(tmp_path, SIMULATED))]) == 2
    out = capsys.readouterr().out
    assert "the audit predates this binding" in out and "re-run `kvaudit audit" in out


@pytest.mark.parametrize("rate, shown", [("NaN", "nan"), ("Infinity", "inf"), ("-0.1", "-0.1"), ("1.5", "1.5"),
                                         ('"0.6"', "str"), ("true", "bool")])
def test_a_simulated_rate_outside_0_1_is_refused(tmp_path, rate, shown):
    from kvaudit.core.errors import DatasetError
    from kvaudit.reports.analysis import Analysis, load_run

    run = make_run(tmp_path / "run", n_per_task=5, n_docs=4, leak_probes=0)
    _simulation(run, rate)
    with pytest.raises(DatasetError) as e:
        Analysis(load_run(run)).simulated_hit_rates()
    assert str(e.value) == (f"{run / 'simulation.json'}: field 'results[0].token_hit_rate' must be a rate "
                            f"in [0, 1], got {shown}")


def test_the_attestation_signs_a_simulation_already_in_the_run(tmp_path):
    from kvaudit.core.attestation import verify_attestation

    run = make_run(tmp_path / "run", n_per_task=5, n_docs=4, leak_probes=0)
    _sign(run)
    assert set(verify_attestation(run, KEY.encode()).subject) == {"manifest.json", "pairs.jsonl"}
    _simulation(run, "0.6")
    _sign(run)
    found = verify_attestation(run, KEY.encode())
    assert found.state == "verified" and "simulation.json" in found.subject
    (run / "simulation.json").unlink()
    found = verify_attestation(run, KEY.encode())
    assert found.state == "broken" and "simulation.json not found" in found.reason


# finding 3: the audit's identity tolerance is range-checked, recorded, shown and judged


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e308", "5", "2.5", "abc"])
def test_an_absurd_identity_tolerance_is_refused_at_the_cli(tmp_path, capsys, value):
    """Before: --identity-tol 5 (and 1e308) accepted; a failed identity control passed."""
    run = make_run(tmp_path / "run", n_per_task=5, n_docs=4, leak_probes=0)
    before = (run / "audit.json").read_bytes()
    assert kvaudit_cli.main(["audit", str(run), "--identity-tol", value]) == 2
    err = capsys.readouterr().err
    assert "argument --identity-tol" in err and "Traceback" not in err
    assert "not a number" in err if value == "abc" else "must be in [0, 2] logits" in err
    assert (run / "audit.json").read_bytes() == before  # nothing written


def test_the_api_refuses_an_absurd_identity_tolerance(tmp_path):
    from kvaudit.audit.audit_cli import audit

    run = make_run(tmp_path / "run", n_per_task=5, n_docs=4, leak_probes=0)
    for bad in (float("nan"), float("inf"), -1e-9, 5.0):
        with pytest.raises(KvauditError, match="--identity-tol must be in"):
            audit(run, identity_tol=bad)


@pytest.fixture
def signed_broken_identity(tmp_path, monkeypatch):
    """The 42-point loser with its identity control broken (a 0.9-logit difference) before the
    audit, signed: its honest audit fails."""
    from kvaudit.core.attestation import KEY_ENV

    run = make_run(tmp_path / "broken", audit_passed=False, **LOSER)
    monkeypatch.setenv(KEY_ENV, KEY)
    _sign(run)
    return run


def test_a_loosened_identity_tolerance_cannot_pass_unless_the_policy_allows_it(signed_broken_identity, tmp_path,
                                                                               capsys):
    """Before: `kvaudit audit RUN --identity-tol 5` by anyone without the key, and the gate passed,
    its table silent about the tolerance."""
    import json

    run = signed_broken_identity
    p = str(policy(tmp_path, LENIENT + "[audit]\nrequire_passed = true\n" + SIGNED))
    assert cli([str(run), "--policy", p]) == 1
    out = capsys.readouterr().out
    assert "| audit passed | ❌ fail | failed |" in out and "identity tolerance 0.0001 (the float32 default)" in out
    assert kvaudit_cli.main(["audit", str(run), "--identity-tol", "1"]) == 0  # within range: the audit passes
    out = capsys.readouterr().out
    assert "note: --identity-tol 1 is looser than the float32 default 0.0001" in out
    assert json.loads((run / "audit.json").read_text())["parameters"]["identity_tol"] == 1.0  # recorded
    assert cli([str(run), "--policy", p]) == 2
    out = capsys.readouterr().out
    assert "| audit passed | ⚠️ cannot judge | passed at a loosened tolerance | passed, identity tolerance ≤ 0.0001 |" in out
    assert "the audit ran with --identity-tol 1, looser than the float32 default 0.0001" in out
    allowing = str(policy(tmp_path, LENIENT + "[audit]\nmax_identity_tol = 1.0\n" + SIGNED, "allow.toml"))
    assert cli([str(run), "--policy", allowing]) == 0  # allowed explicitly, and shown
    assert "identity tolerance 1 (--identity-tol; the float32 default is 0.0001)" in capsys.readouterr().out
    low = str(policy(tmp_path, LENIENT + "[audit]\nmax_identity_tol = 0.5\n" + SIGNED, "low.toml"))
    assert cli([str(run), "--policy", low]) == 2
    assert "and than the policy's [audit] max_identity_tol 0.5" in capsys.readouterr().out


def test_a_tighter_identity_tolerance_needs_no_permission(tmp_path, capsys):
    run = make_run(tmp_path / "run", **{**LOSER, "loss": NO_LOSS})
    assert kvaudit_cli.main(["audit", str(run), "--identity-tol", "0.0001"]) == 0
    capsys.readouterr()
    assert cli([str(run), "--policy", str(policy(tmp_path, LENIENT + "[audit]\n"))]) == 0
    assert "identity tolerance 0.0001 (--identity-tol; the float32 default is 0.0001)" in capsys.readouterr().out


def test_a_hand_edited_recorded_tolerance_is_refused(signed_broken_identity, capsys):
    import json

    run = signed_broken_identity
    assert kvaudit_cli.main(["audit", str(run)]) == 1
    audit = json.loads((run / "audit.json").read_text())
    audit["parameters"]["identity_tol"] = 1e308
    (run / "audit.json").write_text(json.dumps(audit))
    capsys.readouterr()
    assert cli([str(run)]) in (1, 2)  # the shipped policy fails the quality anyway
    out = capsys.readouterr().out
    assert "| audit passed | ⚠️ cannot judge | refused |" in out
    assert "field 'parameters.identity_tol' must be in [0, 2] logits" in out


@pytest.mark.parametrize("value, message", [("nan", "finite"), ("-1", "in [0, 2]"), ("5", "in [0, 2]"),
                                            ('"loose"', "must be a number")])
def test_max_identity_tol_is_validated(tmp_path, value, message):
    p = policy(tmp_path, LENIENT + f"[audit]\nmax_identity_tol = {value}\n", "bad.toml")
    with pytest.raises(KvauditError, match="bad.toml") as e:
        load_policy(p)
    assert "field 'audit.max_identity_tol' (logits)" in str(e.value) and message in str(e.value)


# finding 4: the policy's arm is an arm under test, never a control


@pytest.mark.parametrize("arm", ["identity", "recompute_again"])
def test_a_control_arm_cannot_be_judged_in_place_of_reuse(signed_loser, tmp_path, capsys, arm):
    """Before: both equal the reference by construction, so the 42-point loser passed (exit 0)."""
    p = policy(tmp_path, f'arm = "{arm}"\n[[delta]]\ngroup = "overall"\nmin_lower_bound = -5.0\n' + SIGNED)
    assert cli([str(signed_loser), "--policy", str(p)]) == 2
    out = capsys.readouterr().out
    assert f"field 'arm': '{arm}'" in out and "not an arm under test" in out


@pytest.mark.parametrize("arm, role", [
    ("identity", "identity control"), ("recompute_again", "noise floor"), ("reuse_norope", "position control"),
    ("reuse_first_user", "leak capture"), ("prefix_cache_flushed", "engine prefix flushed"),
    ("prefix_cache_other_tenant", "tenant probe"), ("reuse_other_tenant", "segment tenant probe"),
    ("oracle", "oracle"), ("blend@1", "equals the reference by construction"),
    ("candidate_again", "candidate noise floor"), ("candidate_off", "candidate control"),
])
def test_only_arms_under_test_are_allowed(tmp_path, arm, role):
    p = policy(tmp_path, f'arm = "{arm}"\n' + LENIENT, "arm.toml")
    with pytest.raises(KvauditError, match="arm.toml") as e:
        load_policy(p)
    msg = str(e.value)
    assert f"field 'arm': '{arm}'" in msg and role in msg
    assert ("Allowed arms: reuse, prefix_cache_cold, prefix_cache, candidate, blend@R (R in [0, 1)), epic@K (K >= 0)"
            in msg)


@pytest.mark.parametrize("arm", ["reuse", "prefix_cache", "prefix_cache_cold", "blend@0", "blend@0.15", "epic@16"])
def test_arms_under_test_still_load(tmp_path, arm):
    assert load_policy(policy(tmp_path, f'arm = "{arm}"\n' + LENIENT)).arm == arm
