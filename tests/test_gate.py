"""`kvaudit gate`: exit 0 pass, 1 fail, 2 cannot judge; Markdown summary and JUnit XML."""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET

import pytest

from kvaudit.errors import USER_ERRORS, KvauditError
from kvaudit.reports import gate
from kvaudit.reports.policy import load_policy
from kvaudit.reports.synthetic import make_run
from kvaudit.schema import write_json

NO_LOSS = {"single_doc": 0.0, "multi_hop_bridge": 0.0, "aggregate": 0.0, "agreement": 0.0}


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    gate.add_arguments(parser)
    try:
        return gate.run(parser.parse_args([*argv, "--bootstrap", "300"]))
    except USER_ERRORS:  # the dispatcher's handling; gate should never get here
        return 99


@pytest.fixture(scope="module")
def passing(tmp_path_factory):
    # 60 cases per family with no loss: enough for the -2 and -5 point bounds to hold
    return make_run(tmp_path_factory.mktemp("pass"), n_per_task=60, loss=NO_LOSS)


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("fail"), n_per_task=30)


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
                          "reuse token hit rate (segment)", "neutral-policy text leak rate",
                          "neutral-policy canary exposure"}
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
    make_run(tmp_path, n_per_task=60, loss=NO_LOSS, audit_passed=False)
    assert cli([str(tmp_path)]) == 1
    assert "identity control equals recompute" in capsys.readouterr().out


def test_neutral_exposure_fails_the_gate(tmp_path, capsys):
    make_run(tmp_path, n_per_task=60, loss=NO_LOSS, leak_probes=20, neutral_exposure=1.0)
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
    run = make_run(tmp_path / "run", n_per_task=100, loss={"single_doc": 0.0, "aggregate": 0.0})
    assert cli([str(run)]) == 2  # default policy: no multi-hop cases -> cannot judge
    assert "no answer-quality cases" in capsys.readouterr().out
    policy = tmp_path / "p.toml"
    policy.write_text('[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n'
                      '[[delta]]\nname = "multi-hop"\ngroup = "task:multi_hop_*"\nmin_lower_bound = -5.0\n'
                      'missing = "skip"\n[audit]\n')
    xml = tmp_path / "g.xml"
    assert cli([str(run), "--policy", str(policy), "--junit", str(xml)]) == 0
    cases, suite = junit(xml)
    assert cases["multi-hop"].find("skipped") is not None and suite.get("skipped") == "1"


def test_custom_policy_on_a_stratum(failing, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('arm = "reuse"\n[[delta]]\ngroup = "hops:1"\nmin_lower_bound = -50.0\n')
    assert cli([str(failing), "--policy", str(policy)]) == 0
    policy.write_text('[[delta]]\ngroup = "hops:2"\nmin_lower_bound = -2.0\n')
    assert cli([str(failing), "--policy", str(policy)]) == 1


@pytest.mark.parametrize("text, field", [
    ("[[delta]]\ngroup = 'overall'\nmin_lower_bound = 'x'\n", "delta[0].min_lower_bound"),
    ("[[delta]]\ngroup = 'nonsense'\nmin_lower_bound = -2\n", "delta[0].group"),
    ("thresholds = 1\n", "unknown field 'thresholds'"),
    ("[hit_rate]\nmin = 0.8\nsource = 'guess'\n", "hit_rate.source"),
    ("missing = 'ignore'\n", "field 'missing'"),
    ("not toml at all [\n", "not valid TOML"),
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


def test_simulated_hit_rate_source(passing, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[hit_rate]\nmin = 0.5\nsource = "simulated"\nkey = "segment @ 30GB"\n')
    assert cli([str(passing), "--policy", str(policy)]) == 2  # no simulation.json yet
    write_json(passing / "simulation.json", {"results": [
        {"policy": "segment", "capacity": "30GB", "token_hit_rate": 0.639}]})
    try:
        assert cli([str(passing), "--policy", str(policy)]) == 0
    finally:
        (passing / "simulation.json").unlink()
