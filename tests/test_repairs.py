"""Repair arms without a model: names and order, the audit's repair controls (pass, and fail on
a tampered run naming the case), the recomputed-token count, the oracle's own prompt, the
frontier and its routing line, and the gate judging a repair arm."""

from __future__ import annotations

import json

import pytest

from kvaudit.audit import checks
from kvaudit.core.arms import REPAIR_SWEEP, get_arm, parse_arms, reference_of, repair_count
from kvaudit.core.errors import KvauditError
from kvaudit.reports.analysis import Analysis, load_run
from kvaudit.reports.frontier import build_frontier, route_cheapest
from kvaudit.reports.gate import judge
from kvaudit.reports.policy import load_policy, parse_policy
from kvaudit.runners.registry import arms_for
from kvaudit.testing.synthetic import make_pairs, make_run
from kvaudit.testing.synthetic_repairs import add_oracle_pair, add_repair_arms

LOOSE = """arm = "{arm}"
[[delta]]
name = "overall quality"
group = "overall"
min_lower_bound = -15.0
"""


def _pairs(**kw):
    return add_oracle_pair(add_repair_arms(make_pairs(n_per_task=30, leak_probes=0, **kw)))


def _check(run_dir, name):
    return next(r for r in checks.run_checks(checks.load_for_audit(run_dir)) if r.name == name)


def test_parameterised_names_resolve_in_canonical_order_and_bad_ones_are_refused():
    assert parse_arms("recompute_again,epic@16,oracle,blend@0.30,reuse,blend@0.15") == [
        "recompute", "reuse", "blend@0.15", "blend@0.3", "epic@16", "oracle_recompute", "oracle", "recompute_again"]
    spec = get_arm("blend@0.15")
    assert (spec.role, spec.repair, spec.param, spec.source, spec.portable) == (
        "repair", "blend", 0.15, "neutral", False)
    assert "15%" in spec.why and "must equal" not in spec.why
    assert "must equal reuse exactly" in get_arm("epic@0").why
    assert "must equal recompute" in get_arm("blend@1").why
    assert reference_of("oracle") == "oracle_recompute" and reference_of("blend@0.15") == "recompute"
    for bad, msg in [("blend@1.5", "share R in"), ("blend@-0.1", "share R in"), ("blend@nan", "share R in"),
                     ("epic@-1", "whole number"), ("epic@2.5", "whole number"), ("blend", "unknown arm")]:
        with pytest.raises(KvauditError, match=msg):
            parse_arms(f"reuse,{bad}")
    with pytest.raises(KvauditError, match="needs --backend transformers"):
        arms_for("blend@0.15", "vllm")


def test_the_sweep_runs_on_transformers_only_and_brings_the_oracle_reference():
    arms = arms_for(",".join(REPAIR_SWEEP), "transformers")
    assert arms[:2] == ["recompute", "reuse"] and arms[-1] == "recompute_again"
    assert arms.index("oracle_recompute") < arms.index("oracle")
    assert {a for a in arms if get_arm(a).repair} == {"blend@0", "blend@0.15", "blend@0.3", "blend@1",
                                                     "epic@0", "epic@16", "epic@64"}
    with pytest.raises(KvauditError, match="needs --backend transformers"):
        arms_for(",".join(REPAIR_SWEEP), "vllm")


def test_repair_count_rounds_half_up_and_caps_at_the_segment():
    spans = [(10, 30), (30, 35)]  # 20 + 5 tokens
    assert repair_count(get_arm("epic@8"), spans) == 8 + 5
    assert repair_count(get_arm("epic@0"), spans) == 0
    assert repair_count(get_arm("blend@0.1"), spans) == 3  # 2.5 rounds up
    assert repair_count(get_arm("blend@1"), spans) == 25
    assert repair_count(get_arm("reuse"), spans) == 0


def test_audit_passes_with_repairs_and_the_oracle_pair(tmp_path):
    run = make_run(tmp_path / "run", _pairs())
    audit = json.loads((run / "audit.json").read_text())
    assert audit["verdict"] == "passed", [c for c in audit["checks"] if not c["passed"]]
    by = {c["name"]: c for c in audit["checks"]}
    assert "blend@0 on 120" in by["repair_equals_reuse"]["detail"]
    assert "blend@1 on 120 cases" in by["repair_equals_recompute"]["detail"]
    assert "oracle pair consumed one evidence-only prompt" in by["same_inputs"]["detail"]


def test_a_repair_that_recomputes_nothing_must_equal_reuse_bit_for_bit(tmp_path):
    pairs = _pairs()
    victim = pairs[3]
    victim.arms["epic@0"].logit_diff_vs_recompute += 1e-7  # one ulp-sized change is a failure
    r = _check(make_run(tmp_path / "run", pairs, audit_passed=None), "repair_equals_reuse")
    assert not r.passed and r.failing_cases == [victim.case_id]
    assert "epic@0" in r.detail and "logit_diff_vs_recompute" in r.detail


def test_a_repair_that_recomputes_everything_must_equal_recompute(tmp_path):
    pairs = _pairs()
    victim = pairs[5]
    victim.arms["blend@1"].logit_diff_vs_recompute = 0.5
    r = _check(make_run(tmp_path / "run", pairs, audit_passed=None), "repair_equals_recompute")
    assert not r.passed and r.failing_cases == [victim.case_id]
    assert "0.5 > 0.0001" in r.detail


def test_the_reuse_control_cannot_be_judged_without_reuse(tmp_path):
    pairs = _pairs()
    for p in pairs:
        del p.arms["reuse"]
        p.arm_order.remove("reuse")
    r = _check(make_run(tmp_path / "run", pairs, audit_passed=None), "repair_equals_reuse")
    assert r.cannot_judge and not r.passed


def test_a_wrong_recomputed_count_fails_reuse_happened(tmp_path):
    pairs = _pairs()
    victim = pairs[7]
    victim.arms["blend@0.15"].tokens_reused += 1
    victim.arms["blend@0.15"].tokens_computed -= 1
    r = _check(make_run(tmp_path / "run", pairs, audit_passed=None), "reuse_happened")
    assert not r.passed and r.failing_cases == [victim.case_id]
    assert "it must recompute" in r.detail


def test_the_oracle_must_consume_the_evidence_only_prompt(tmp_path):
    pairs = _pairs()
    victim = next(p for p in pairs if "oracle" in p.arms and len(p.segment_ids) > len(p.evidence))
    victim.arms["oracle"].segment_hashes = list(victim.segment_hashes)  # the full prompt's segments
    r = _check(make_run(tmp_path / "run", pairs, audit_passed=None), "same_inputs")
    assert not r.passed and r.failing_cases == [victim.case_id]
    assert "not the pair's evidence segments" in r.detail


def test_frontier_routes_each_family_to_its_cheapest_non_inferior_arm(tmp_path):
    run = make_run(tmp_path / "run", _pairs())
    policy = parse_policy({"arm": "reuse", "delta": [{"group": "overall", "min_lower_bound": -15.0},
                                                      {"group": "task:multi_hop_*", "min_lower_bound": -15.0}]}, "t")
    an = Analysis(load_run(run))
    f = build_frontier(an, policy)
    assert f["arms"] == ["reuse", "blend@0", "blend@0.15", "blend@1", "epic@0", "epic@16"]
    groups = {g["group"]: g for g in f["groups"]}
    # reuse loses a third of multi-hop answers; blend@0.15 recovers them at 0.3 x recompute's TTFT
    hop = groups["task:multi_hop_bridge"]
    assert hop["route"]["arm"] == "blend@0.15", hop["route"]
    pts = {p["arm"]: p for p in hop["points"]}
    assert not pts["reuse"]["non_inferior"] and pts["blend@0.15"]["non_inferior"]
    assert pts["blend@0.15"]["recomputed_share"] == pytest.approx(0.15, abs=0.002)
    assert pts["blend@1"]["recomputed_share"] == 1.0 and pts["reuse"]["recomputed_share"] == 0.0
    assert pts["blend@0.15"]["speedup"] == pytest.approx(1 / 0.3)
    # where reuse loses nothing it is the cheapest non-inferior arm itself
    assert groups["task:single_doc"]["route"]["arm"] == "reuse"
    # the oracle split: reuse's loss = distractors + what the oracle still loses
    split = {r["group"]: r for r in f["oracle"]}["task:multi_hop_bridge"]
    assert split["reuse_delta"] == pytest.approx(split["oracle_delta"] + split["distractor_part"])
    assert split["reuse_delta"] < split["oracle_delta"] <= 0


def test_routing_names_no_arm_when_none_clears_the_margin():
    pts = [{"arm": "reuse", "non_inferior": False, "ttft_median": 0.1, "lower_bound": -9.0, "speedup": 9.0},
           {"arm": "blend@0.15", "non_inferior": False, "ttft_median": 0.3, "lower_bound": None, "speedup": 3.0}]
    route = route_cheapest(pts, -2.0)
    assert route["arm"] is None and "route to recompute" in route["reason"] and "1 of 2" in route["reason"]
    assert route_cheapest(pts, None)["arm"] is None


def test_gate_judges_a_repair_arm(tmp_path):
    run = make_run(tmp_path / "run", _pairs())
    loose = tmp_path / "loose.toml"
    loose.write_text(LOOSE.format(arm="blend@0.15"))
    judged = judge(run, loose)
    verdict, results, arm, error = judged.verdict, judged.results, judged.arm, judged.error
    assert error is None and arm == "blend@0.15"
    assert verdict == "pass", [(r.name, r.status, r.detail) for r in results]
    loose.write_text(LOOSE.format(arm="reuse"))
    # reuse's interval on the same run, about [-21, -6], straddles -15: too few cases to tell
    assert judge(run, loose).verdict == "error"
    loose.write_text(LOOSE.format(arm="reuse").replace("-15.0", "-5.0"))
    assert judge(run, loose).verdict == "fail"  # and lies wholly below -5: a confirmed loss
    loose.write_text(LOOSE.format(arm="blend@2"))
    judged = judge(run, loose)
    verdict, error = judged.verdict, judged.error
    assert verdict == "error" and "share R in" in error
    assert load_policy(None).arm == "reuse"


def test_report_has_the_frontier_and_the_oracle_note(tmp_path):
    from kvaudit.reports.report import write_report

    run = make_run(tmp_path / "run", _pairs())
    html = write_report(run).read_text()
    for element_id in ("frontier-plot", "frontier-routing", "frontier-table", "oracle-table"):
        assert f'id="{element_id}"' in html, element_id
    assert "compared only with its own recompute" in html
    summary = json.loads((run / "summary.json").read_text())
    assert summary["frontier"]["groups"] and summary["frontier"]["oracle"]
