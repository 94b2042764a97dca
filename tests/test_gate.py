"""`kvaudit gate`: exit 0 pass, 1 fail, 2 cannot judge; Markdown summary and JUnit XML."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET

import pytest

from kvaudit.core.errors import USER_ERRORS, KvauditError
from kvaudit.core.jsonio import write_json
from kvaudit.reports import gate_cli as gate
from kvaudit.reports.policy import load_policy
from kvaudit.testing.synthetic import make_run

NO_LOSS = {"single_doc": 0.0, "multi_hop_bridge": 0.0, "aggregate": 0.0, "agreement": 0.0}


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    gate.add_arguments(parser)
    try:
        return gate.run(parser.parse_args(argv))
    except USER_ERRORS:  # the dispatcher's handling; gate should never get here
        return 99


# No loss on 100 cases per family over 40 documents: enough for the -2 and -5 point bounds to
# hold (zero discordant pairs bound the loss at about t^2/n); 80 leak probes without a leak:
# enough for a 0-of-n text-leak rate to bound 5% (73) and for the rank test's power.
PASSING = dict(n_per_task=100, loss=NO_LOSS, n_docs=40, leak_probes=80)


@pytest.fixture(scope="module")
def passing(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("pass"), **PASSING)


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("fail"), n_per_task=150, n_docs=40, leak_probes=80)


def junit(path):
    root = ET.parse(path).getroot()
    return {c.get("name"): c for c in root.iter("testcase")}, root.find("testsuite")


def test_pass_exits_0_with_markdown_and_junit(passing, tmp_path, capsys):
    xml, md = tmp_path / "gate.xml", tmp_path / "gate.md"
    assert cli([str(passing), "--junit", str(xml), "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## kvaudit gate: ✅ PASS")
    assert "| threshold | result | observed | required | detail |" in out
    assert md.read_text().strip() == out.strip()
    cases, suite = junit(xml)
    assert set(cases) == {"overall quality", "multi-hop quality", "audit passed",
                          "reuse chunk-aligned hit rate", "neutral-policy text leak rate",
                          "neutral-policy canary exposure",
                          "overall quality: noise floor (recompute_again)",
                          "multi-hop quality: noise floor (recompute_again)"}
    assert suite.get("failures") == "0" and suite.get("errors") == "0"
    assert not any(c.find("failure") is not None for c in cases.values())


def test_planted_loss_exits_1_and_names_the_failing_thresholds(failing, tmp_path, capsys):
    xml = tmp_path / "gate.xml"
    assert cli([str(failing), "--junit", str(xml)]) == 1
    assert "❌ FAIL" in capsys.readouterr().out
    cases, suite = junit(xml)
    assert cases["multi-hop quality"].find("failure") is not None
    assert cases["audit passed"].find("failure") is None
    assert int(suite.get("failures")) >= 1 and suite.get("errors") == "0"


def test_failed_audit_exits_1(tmp_path, capsys):
    make_run(tmp_path, **PASSING, audit_passed=False)
    assert cli([str(tmp_path)]) == 1
    assert "failed checks: identity_control" in capsys.readouterr().out


def test_neutral_exposure_fails_the_gate(tmp_path, capsys):
    make_run(tmp_path, **{**PASSING, "neutral_exposure": 1.0})
    assert cli([str(tmp_path)]) == 1
    assert "| neutral-policy canary exposure | ❌ fail" in capsys.readouterr().out


@pytest.mark.parametrize("breakage", [
    lambda d: (d / "audit.json").unlink(),                      # audit not run
    lambda d: (d / "pairs.jsonl").write_text("{not json\n{}\n"),  # corrupt
    lambda d: (d / "pairs.jsonl").unlink(),                     # missing
    lambda d: (d / "manifest.json").write_text("[]"),           # wrong shape
])
def test_unjudgeable_runs_exit_2_with_junit_error(tmp_path, capsys, breakage):
    make_run(tmp_path / "run", n_per_task=3, loss=NO_LOSS)
    breakage(tmp_path / "run")
    xml = tmp_path / "gate.xml"
    assert cli([str(tmp_path / "run"), "--junit", str(xml)]) == 2
    assert "⚠️ CANNOT JUDGE" in capsys.readouterr().out
    _, suite = junit(xml)
    assert int(suite.get("errors")) >= 1


def test_missing_run_dir_exits_2(tmp_path):
    assert cli([str(tmp_path / "nope")]) == 2


def test_threshold_without_cases_is_error_unless_policy_says_skip(tmp_path, capsys):
    run = make_run(tmp_path / "run", n_per_task=150, loss={"single_doc": 0.0, "aggregate": 0.0},
                   n_docs=40, leak_probes=0)
    assert cli([str(run)]) == 2  # default policy: no multi-hop cases -> cannot judge
    assert "no answer-quality cases" in capsys.readouterr().out
    policy = tmp_path / "p.toml"
    policy.write_text('[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n'
                      '[[delta]]\nname = "multi-hop"\ngroup = "task:multi_hop_*"\nmin_lower_bound = -5.0\n'
                      'missing = "skip"\n[audit]\n')
    xml = tmp_path / "g.xml"
    assert cli([str(run), "--policy", str(policy), "--junit", str(xml)]) == 0
    cases, suite = junit(xml)
    # the threshold and its noise-floor control are both skipped, nothing else
    assert cases["multi-hop"].find("skipped") is not None and suite.get("skipped") == "2"
    assert cases["multi-hop: noise floor (recompute_again)"].find("skipped") is not None


def test_custom_policy_on_a_stratum(failing, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('arm = "reuse"\n[[delta]]\ngroup = "hops:1"\nmin_lower_bound = -50.0\n')
    assert cli([str(failing), "--policy", str(policy)]) == 0
    policy.write_text('[[delta]]\ngroup = "hops:2"\nmin_lower_bound = -5.0\n')
    assert cli([str(failing), "--policy", str(policy)]) == 1


@pytest.mark.parametrize("text, field", [
    ("[[delta]]\ngroup = 'overall'\nmin_lower_bound = 'x'\n", "delta[0].min_lower_bound"),
    ("[[delta]]\ngroup = 'nonsense'\nmin_lower_bound = -2\n", "delta[0].group"),
    ("thresholds = 1\n", "unknown field 'thresholds'"),
    ("[hit_rate]\nmin = 0.8\nsource = 'guess'\n", "hit_rate.source"),
    ("missing = 'ignore'\n", "field 'missing'"),
    ("not toml at all [\n", "not valid TOML"),
    ("", "sets no threshold"),  # finding 2: an empty policy passed with nothing checked
    ("arm = 'reuse'\n", "sets no threshold"),
    ("confidence = 0.5\n[audit]\n", "field 'confidence'"),  # finding 5: the bound became the estimate
    ("confidence = 1.0\n[audit]\n", "field 'confidence'"),
    ("[security]\nmax_timing_auc = 1.0\n", "security.max_timing_auc"),  # at 1 every run would pass
    ("[security]\nrequire_tenant_isolation = 'yes'\n", "security.require_tenant_isolation"),
    ("[security]\nrequire_tenant_isolation = false\n", "sets no threshold"),
])
def test_bad_policy_is_a_clear_error_and_exit_2(tmp_path, passing, capsys, text, field):
    policy = tmp_path / "bad.toml"
    policy.write_text(text)
    with pytest.raises(KvauditError, match="bad.toml") as e:
        load_policy(policy)
    assert field in str(e.value)
    assert cli([str(passing), "--policy", str(policy)]) == 2
    assert field in capsys.readouterr().out


def test_default_policy_ships_the_documented_thresholds():
    p = load_policy()
    deltas = {c.params["group"]: c.params["min_lower_bound"] for c in p.checks if c.kind == "delta"}
    assert deltas == {"overall": -2.0, "task:multi_hop_*": -5.0}
    kinds = [c.kind for c in p.checks]
    assert kinds.count("audit") == 1 and "hit_rate" in kinds and "leak_text" in kinds
    assert next(c for c in p.checks if c.kind == "hit_rate").params["min"] == 0.8
    assert p.margin_for_task("multi_hop_compare") == -5.0 and p.margin_for_task("single_doc") == -2.0


def test_security_checks_without_probes_cannot_pass(passing, tmp_path, capsys):
    # An in-process run has no tenant probes: a policy that asks for isolation or a timing bound
    # must not pass it (missing = error, the default), and says what is missing.
    policy = tmp_path / "p.toml"
    policy.write_text('[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n'
                      "[security]\nrequire_tenant_isolation = true\nmax_timing_auc = 0.75\n")
    assert cli([str(passing), "--policy", str(policy)]) == 2
    out = capsys.readouterr().out
    assert "tenant isolation" in out and "timing side channel" in out and "no tenant-probe arm" in out


def test_simulated_hit_rate_source(passing, tmp_path):
    from kvaudit.audit.audit_cli import audit

    policy = tmp_path / "p.toml"
    policy.write_text('[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n'
                      '[hit_rate]\nmin = 0.5\nsource = "simulated"\nkey = "segment @ 30GB"\n')
    assert cli([str(passing), "--policy", str(policy)]) == 2  # no simulation.json yet
    write_json(passing / "simulation.json", {"results": [
        {"policy": "segment", "capacity": "30GB", "token_hit_rate": 0.639}]})
    try:
        assert cli([str(passing), "--policy", str(policy)]) == 2  # not bound to the run until audited
        audit(passing)
        assert cli([str(passing), "--policy", str(policy)]) == 0
    finally:
        (passing / "simulation.json").unlink()
        audit(passing)


# ---------------------------------------------------------------- issue 12 regressions


def _rewrite_pairs(run, edit):
    path = run / "pairs.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    edit(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("edit", [
    lambda rows: rows[0]["arms"]["identity"].update(logit_diff_vs_recompute=0.9),  # broken identity
    lambda rows: rows[0]["arms"]["reuse"].update(tokens_reused=0),                 # silent zero hit
    lambda rows: rows.append({**rows[-1], "case_id": "appended"}),                 # extended run
])
def test_stale_audit_cannot_pass_the_gate(tmp_path, capsys, edit):
    """Finding 1: the gate read 'audit passed' from an audit.json older than the pairs."""
    run = make_run(tmp_path / "run", **PASSING)
    assert cli([str(run)]) == 0
    capsys.readouterr()
    _rewrite_pairs(run, edit)
    assert cli([str(run)]) == 2
    out = capsys.readouterr().out
    assert "| audit passed | ⚠️ cannot judge | refused |" in out and "stale" in out


@pytest.mark.parametrize("content", [
    {"passed": True, "checks": []},                                     # hand-written
    {"format": 2, "kvaudit_version": "0.0.1", "passed": True, "checks": []},  # foreign version
])
def test_hand_written_or_foreign_audit_is_refused(tmp_path, capsys, content):
    run = make_run(tmp_path / "run", **PASSING)
    write_json(run / "audit.json", content)
    assert cli([str(run)]) == 2
    assert "| audit passed | ⚠️ cannot judge | refused |" in capsys.readouterr().out


def test_audit_with_edited_verdict_is_refused(tmp_path, capsys):
    """``passed`` is derived from the fresh checks, never trusted as a field."""
    run = make_run(tmp_path / "run", **PASSING, audit_passed=False)
    audit = json.loads((run / "audit.json").read_text())
    audit.update(passed=True, verdict="passed")
    for c in audit["checks"]:
        c["passed"] = True
    write_json(run / "audit.json", audit)
    assert cli([str(run)]) == 2
    assert "does not match a fresh audit" in capsys.readouterr().out


def test_empty_policy_file_is_an_error(passing, tmp_path, capsys):
    """Finding 2: a zero-byte policy printed PASS with no threshold checked."""
    empty = tmp_path / "EMPTY.toml"
    empty.write_text("")
    assert cli([str(passing), "--policy", str(empty)]) == 2
    assert "sets no threshold" in capsys.readouterr().out


def test_too_few_documents_cannot_be_judged(tmp_path, capsys):
    """Finding 4: 200 unchanged cases on 2 documents gave a passing bound."""
    run = make_run(tmp_path / "run", n_per_task=100, loss={"single_doc": 0.0, "aggregate": 0.0},
                   n_docs=2, leak_probes=0)
    policy = tmp_path / "p.toml"
    policy.write_text('[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n')
    assert cli([str(run), "--policy", str(policy)]) == 2
    out = capsys.readouterr().out
    assert "200 case(s) on 2 document(s)" in out and "cannot judge" in out


def test_the_gate_judges_what_the_report_plots(passing):
    """Finding 5: the plot drew two-sided 95% intervals, the gate a one-sided 95% bound."""
    from kvaudit.reports.analysis import Analysis, load_run

    an = Analysis(load_run(passing))
    d = an.delta("reuse", "overall")
    assert d.ci == [d.lower_bound, d.upper_bound]
    with pytest.raises(ValueError, match="confidence"):
        Analysis(load_run(passing), confidence=0.5)


def test_bootstrap_option_is_gone_not_silently_ignored(passing):
    parser = argparse.ArgumentParser()
    gate.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([str(passing), "--bootstrap", "0"])


def test_few_leak_probes_cannot_be_judged_not_passed(tmp_path, capsys):
    """Finding 6: 0 text leaks in 10 probes passed although the Wilson upper bound is 28%."""
    run = make_run(tmp_path / "run", **{**PASSING, "leak_probes": 10})
    assert cli([str(run)]) == 2
    out = capsys.readouterr().out
    assert "| neutral-policy text leak rate | ⚠️ cannot judge | 0 of 10" in out
    assert "73 probes without a leak would be needed" in out


def test_three_probes_with_a_large_exposure_do_not_pass(tmp_path, capsys):
    """Finding 6: three probes with a +5 nat exposure passed."""
    run = make_run(tmp_path / "run", **{**PASSING, "leak_probes": 3, "neutral_exposure": 5.0})
    assert cli([str(run)]) != 0
    assert "| neutral-policy canary exposure | ✅ pass" not in capsys.readouterr().out


def test_noise_floor_is_held_to_the_thresholds(tmp_path, capsys):
    """Finding 7: recompute_again only warned. A noise floor that flips as often as reuse
    makes the run unjudgeable, even where reuse itself would clear the margin."""
    from kvaudit.testing.synthetic import make_pairs

    pairs = make_pairs(**PASSING)
    for i, p in enumerate(pairs):
        if p.task != "leak_probe" and i % 8 == 0 and p.answers:
            p.arms["recompute_again"].answer = "something else"
    run = make_run(tmp_path / "run", pairs)
    assert cli([str(run)]) == 2
    out = capsys.readouterr().out
    assert "noise floor (recompute_again) | ⚠️ cannot judge" in out
    assert "recompute against itself does not clear the threshold" in out


def test_agreement_cases_are_their_own_group(passing):
    """Finding 8: agreement cases (recompute scored against itself) were pooled into overall."""
    from kvaudit.reports.analysis import Analysis, load_run

    an = Analysis(load_run(passing))
    overall, agreement = set(an.select("overall")), set(an.select("agreement"))
    assert agreement and not overall & agreement
    assert all(c.startswith("agreement-") for c in agreement)
    assert "agreement" in an.groups()
    assert not set(an.select("hops:1")) & agreement


def test_partial_run_cannot_be_judged_unless_allowed(tmp_path, capsys):
    """Finding 9: a partial run was judged on the cases that finished."""
    run = make_run(tmp_path / "run", **PASSING)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["dataset"]["n_cases"] += 5
    write_json(run / "manifest.json", manifest)
    (run / "audit.json").unlink()
    from kvaudit.audit.audit_cli import audit

    audit(run)
    assert cli([str(run)]) == 2
    out = capsys.readouterr().out
    assert "| run complete | ⚠️ cannot judge |" in out and "5 case(s) missing" in out
    assert cli([str(run), "--allow-partial"]) == 0
    assert "judged on the finished cases only; 5 missing" in capsys.readouterr().out


def test_min_icc_floors_the_design_effect(passing, tmp_path):
    """A policy's min_icc makes the bound wider on clustered cases (and is validated)."""
    from kvaudit.reports.analysis import Analysis, load_run

    run = load_run(passing)
    plain, floored = Analysis(run).delta("reuse", "overall"), Analysis(run, min_icc=0.2).delta("reuse", "overall")
    assert floored.deff > plain.deff and floored.lower_bound < plain.lower_bound
    policy = tmp_path / "p.toml"
    policy.write_text("min_icc = 1.5\n[audit]\n")
    with pytest.raises(KvauditError, match="min_icc"):
        load_policy(policy)


# ---------------------------------------------------------------- issue 42: answers changed, gated

FLIPS_ONLY = 'arm = "reuse"\n[flips]\nmax_rate = {rate}\n'


def test_the_flip_rate_is_gated_by_its_upper_bound(passing, failing, tmp_path, capsys):
    """A policy may bound how often answers change (a quality threshold of its own): no flips in
    480 cases (400 answer-quality cases and 80 leak probes) pass 5%; the failing run's flips fail
    it; a threshold inside the interval cannot be judged."""
    pol = tmp_path / "flips.toml"
    pol.write_text(FLIPS_ONLY.format(rate=0.05))
    assert cli([str(passing), "--policy", str(pol)]) == 0
    out = capsys.readouterr().out
    assert "| answers changed vs recompute | ✅ pass | 0 of 480 (0.0%), upper bound 0.8%" in out
    assert "interval [0.0%, 0.8%]" in out  # a rate's interval, never below 0
    assert cli([str(failing), "--policy", str(pol)]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| answers changed vs recompute |"))
    assert "❌ fail" in row and "upper bound ≤ 5.0%" in row
    from kvaudit.reports.analysis import Analysis, load_run

    b = Analysis(load_run(failing)).flip_bound("reuse")
    pol.write_text(FLIPS_ONLY.format(rate=round((b.lower + b.upper) / 2, 4)))
    assert cli([str(failing), "--policy", str(pol)]) == 2
    assert "cannot judge: the interval straddles the threshold" in capsys.readouterr().out


def test_a_flip_threshold_below_the_engines_own_noise_cannot_pass(tmp_path, capsys):
    """recompute_again changing answers as often as the threshold allows: the noise floor's row
    cannot judge, so the gate cannot pass whatever the arm's own rate."""
    from kvaudit.testing.synthetic import make_pairs

    pairs = make_pairs(**PASSING)
    for i, p in enumerate(pairs):
        if "recompute_again" in p.arms and i % 5 == 0:
            p.arms["recompute_again"].answer += " (again)"
    run = make_run(tmp_path / "run", pairs)
    pol = tmp_path / "flips.toml"
    pol.write_text(FLIPS_ONLY.format(rate=0.05))
    assert cli([str(run), "--policy", str(pol)]) == 2
    out = capsys.readouterr().out
    assert "answers changed vs recompute: noise floor (recompute_again)" in out
    assert "recompute against itself does not clear the threshold" in out


def test_a_flip_rate_outside_0_1_is_refused_naming_the_field(passing, tmp_path, capsys):
    pol = tmp_path / "flips.toml"
    pol.write_text(FLIPS_ONLY.format(rate=1.5))
    assert cli([str(passing), "--policy", str(pol)]) == 2
    assert "flips.max_rate" in capsys.readouterr().err
