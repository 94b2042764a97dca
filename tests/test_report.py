"""`kvaudit report` on synthetic run directories: summary.json, report.html, samples.jsonl."""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import json
import re
from pathlib import Path

import pytest

from kvaudit.core.errors import USER_ERRORS
from kvaudit.core.jsonio import sha256_hex, write_json
from kvaudit.reports import report_cli
from kvaudit.reports.html import FILTER_JS, diff_spans
from kvaudit.reports.report import write_report
from kvaudit.testing.synthetic import make_pairs, make_run

INJECT = '<script>document.title="PWNED"</script><img src=x onerror=alert(1)>'


def cli(argv: list[str]) -> int:
    """Run the report command the way the dispatcher does (user errors -> exit 2)."""
    parser = argparse.ArgumentParser()
    report_cli.add_arguments(parser)
    try:
        return report_cli.run(parser.parse_args(argv))
    except USER_ERRORS:
        return 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    make_run(d, n_per_task=40, injected=INJECT)
    write_json(d / "simulation.json", {"results": [
        {"policy": "segment", "capacity": "30GB", "token_hit_rate": 0.639},
        {"policy": "prefix", "capacity": "30GB", "token_hit_rate": 0.033}]})
    write_report(d)
    return d


def test_report_writes_three_files_and_prints_path(tmp_path, capsys):
    make_run(tmp_path, n_per_task=5, leak_probes=2)
    assert cli([str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(tmp_path / "report.html")
    for name in ("summary.json", "report.html", "samples.jsonl"):
        assert (tmp_path / name).stat().st_size > 0


def test_summary_has_the_planted_effects(run_dir):
    s = json.loads((run_dir / "summary.json").read_text())
    rows = {r["group"]: r for r in s["comparisons"]["reuse"]}
    assert rows["task:multi_hop_bridge"]["ci"][1] < 0  # planted 30% loss
    assert rows["task:single_doc"]["delta"] == 0.0  # planted no loss
    assert set(rows) >= {"overall", "hops:2", "evidence_position:first", "prefix_variant:date"}
    for r in rows.values():
        assert r["p_adj"] >= r["p"]
    assert s["comparisons"]["recompute_again"][0]["delta"] == 0.0
    assert s["noise_floor"]["flips"] == 0 and s["flips"]["reuse"]["flips"] > 0
    assert s["hit_rate"]["measured"]["reuse"] == pytest.approx(0.9, abs=0.01)
    assert s["hit_rate"]["simulated"] == {"segment @ 30GB": 0.639, "prefix @ 30GB": 0.033}
    assert s["speedup"]["reuse"]["median_paired"] == pytest.approx(12.0)
    assert set(s["ttft"]["recompute"]) == {"n", "mean", "p50", "p90", "p99"}
    assert s["audit"] == {"ran": True, "state": "verified", "reason": "", "verdict": "passed",
                          "passed": True, "checks": s["audit"]["checks"]}
    # the planted multi-hop loss fails its threshold (its whole interval lies below the margin);
    # 10 leak probes are too few for the leak checks, which cannot be judged; a failed threshold
    # is a decision, so the verdict is fail with those rows still listed
    checks = {c["name"]: c["status"] for c in s["gate"]["checks"]}
    assert checks["multi-hop quality"] == "fail" and s["gate"]["verdict"] == "fail"
    assert checks["neutral-policy text leak rate"] == "error"
    excess = s["flip_excess"]["reuse"]
    assert excess["delta"] == pytest.approx(100 * s["flips"]["reuse"]["rate"], abs=1e-9) and excess["n"] > 0
    assert "recompute_again" not in s["flip_excess"]
    routing = {r["task"]: r["recommendation"] for r in s["routing"]}
    assert routing["multi_hop_bridge"] == "unsafe"
    assert routing["single_doc"] in ("safe", "undecided")
    assert s["coverage"]["share_never_cached_position"] == 0.72
    assert s["leaks"]["n_probes"] == 10


def test_routing_safe_with_enough_unchanged_cases(tmp_path):
    make_run(tmp_path, n_per_task=300, loss={"single_doc": 0.0}, leak_probes=0, n_docs=40)
    write_report(tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["routing"] == [{**s["routing"][0], "task": "single_doc", "recommendation": "safe"}]


def test_html_escapes_corpus_text_and_pins_its_own_script(run_dir):
    page = (run_dir / "report.html").read_text()
    assert "&lt;script&gt;document.title=" in page
    assert '<script>document.title="PWNED"' not in page and "<img src=x" not in page
    assert page.count("<script>") == 1
    digest = base64.b64encode(hashlib.sha256(FILTER_JS.encode()).digest()).decode()
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page)[1])
    assert f"script-src 'sha256-{digest}'" in csp and "default-src 'none'" in csp
    assert f"<script>{FILTER_JS}</script>" in page


def test_html_is_self_contained_and_in_order(run_dir):
    page = (run_dir / "report.html").read_text()
    assert not re.search(r'(src|href)="https?:', page)
    assert "@import" not in page
    ids = ["verdict", "audit", "forest", "deltas", "leaks", "noise", "coverage", "speed", "cases", "routing"]
    positions = [page.index(f'<section id="{i}">') for i in ids]
    assert positions == sorted(positions)
    assert re.search(r'<div class="forest" id="forest-plot"><svg', page)
    assert "segment @ 30GB" in page  # simulated beside measured


def test_report_handles_missing_audit_and_coverage(tmp_path):
    make_run(tmp_path, n_per_task=5, leak_probes=0, audit_passed=None, coverage={})
    page = write_report(tmp_path).read_text()
    assert 'id="audit-verdict">NOT RUN' in page
    assert "records no coverage" in page
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["audit"]["ran"] is False and s["gate"]["verdict"] == "error"
    assert s["leaks"]["n_probes"] == 0


def test_samples_export_lm_eval_style(run_dir):
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    pairs = {p.case_id: p for p in make_pairs(n_per_task=40, injected=INJECT)}
    assert len(rows) == len(pairs)
    for r in rows:
        p = pairs[r["doc_id"]]
        assert r["prompt_hash"] == p.ids_hash
        assert r["doc_hash"] == sha256_hex(",".join(p.segment_ids))
        assert set(r["resps"]) == set(p.arms) == set(r["metrics"])
        if p.metric == "agreement":
            assert r["target"] == [p.arms["recompute"].answer]
    flipped = next(r for r in rows if r["flips"].get("reuse"))
    assert flipped["metrics"]["reuse"]["score"] < flipped["metrics"]["recompute"]["score"]


def test_diff_spans_mark_only_the_differing_words():
    left, right = diff_spans("The answer is Film 12", "The answer is Film 112 today")
    assert [t for t, changed in left if changed] == ["12"]
    assert "".join(t for t, changed in right if changed).split() == ["112", "today"]
    assert "".join(t for t, _ in right) == "The answer is Film 112 today"


@pytest.mark.parametrize("breakage, message", [
    (lambda d: (d / "pairs.jsonl").write_text('{"case_id": 1}\n{"x": 2}\n'), "pairs.jsonl, line 1"),
    (lambda d: (d / "manifest.json").unlink(), "manifest.json: file not found"),
])
def test_bad_run_files_give_a_clear_error(tmp_path, capsys, breakage, message):
    make_run(tmp_path, n_per_task=3, leak_probes=0)
    breakage(tmp_path)
    with pytest.raises(USER_ERRORS, match=re.escape(message)):
        write_report(tmp_path)
    assert cli([str(tmp_path)]) == 2


@pytest.mark.parametrize("content", ['{"passed": "yes"}', '{"passed": true, "checks": []}', "{not json"])
def test_unverifiable_audit_is_shown_as_refused(tmp_path, content):
    """The report never shows an audit.json it cannot tie to the run's files as passed."""
    make_run(tmp_path, n_per_task=3, leak_probes=0)
    (tmp_path / "audit.json").write_text(content)
    page = write_report(tmp_path).read_text()
    assert 'id="audit-verdict">REFUSED' in page and 'id="audit-refused"' in page
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["audit"]["state"] == "refused" and s["audit"]["passed"] is None
    assert s["gate"]["verdict"] == "error"


def test_partial_run_names_its_missing_cases(tmp_path):
    make_run(tmp_path, n_per_task=3, leak_probes=0)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["dataset"]["n_cases"] += 2
    write_json(tmp_path / "manifest.json", manifest)
    page = write_report(tmp_path).read_text()
    assert 'id="missing-cases"' in page and "2 unnamed" in page


def test_cases_missing_a_stratum_are_left_out_of_its_groups(tmp_path):
    pairs = make_pairs(n_per_task=12, seed=3)
    key = next(k for k in pairs[0].strata)
    for p in pairs[:5]:
        p.strata.pop(key)  # e.g. leak probes have no evidence position
    run = make_run(tmp_path / "run", pairs)
    write_report(run)
    summary = json.loads((run / "summary.json").read_text())
    rows = [r for r in summary["comparisons"]["reuse"] if r["group"].startswith(f"{key}:")]
    assert rows and sum(r["n"] for r in rows) <= len(pairs) - 5


def test_cross_backend_table_counts_agreement_and_refuses_another_dataset(tmp_path):
    from kvaudit.testing.synthetic import make_pairs

    pairs = make_pairs(n_per_task=6, seed=4)
    a = make_run(tmp_path / "a", pairs)
    other = make_pairs(n_per_task=6, seed=4)
    changed = {other[0].case_id, other[1].case_id}
    for p in other[:2]:
        p.arms["recompute"].answer += " (other backend)"
    b = make_run(tmp_path / "b", other)
    assert cli([str(a), "--compare", str(b)]) == 0
    s = json.loads((a / "summary.json").read_text())
    (x,) = s["cross_backend"]
    rows = {r["arm"]: r for r in x["arms"]}
    assert x["n_common"] == x["ids_equal"] == len(pairs)
    assert rows["recompute"]["answers_equal"] == len(pairs) - len(changed)
    assert rows["reuse"]["answers_equal"] == len(pairs)
    fa = [p.arms["reuse"].answer != p.arms["recompute"].answer for p in pairs]
    fb = [p.arms["reuse"].answer != p.arms["recompute"].answer for p in other]
    assert fa != fb  # the changed recompute answers make reuse flip differently on b
    assert rows["reuse"]["flip_cases_agree"] == sum(u == v for u, v in zip(fa, fb))
    assert (rows["reuse"]["flips_a"], rows["reuse"]["flips_b"]) == (sum(fa), sum(fb))
    page = (a / "report.html").read_text()
    assert 'id="cross-backend-1"' in page and str(b) in page

    manifest = json.loads((b / "manifest.json").read_text())
    manifest["dataset"]["hash"] = manifest["identity"]["dataset_hash"] = "1" * 32
    (b / "manifest.json").write_text(json.dumps(manifest))
    assert cli([str(a), "--compare", str(b)]) == 2


def test_figures_are_inline_svg_and_flip_rates_per_group_match_the_cases(run_dir):
    page = (run_dir / "report.html").read_text()
    for figure in ("forest-plot", "flip-strata-plot", "ttft-plot"):
        assert re.search(rf'id="{figure}"><svg', page), figure
    s = json.loads((run_dir / "summary.json").read_text())
    by_group = {r["group"]: r for r in s["flips_by_group"]["reuse"]}
    assert by_group["overall"]["n"] == s["run"]["n_quality_cases"]
    flipped = set(s["flips"]["reuse"]["flipped_cases"])
    bridge = by_group["task:multi_hop_bridge"]
    assert bridge["flips"] == sum(c.startswith("multi_hop_bridge-") for c in flipped)
    assert bridge["ci"][0] <= bridge["rate"] <= bridge["ci"][1]
    assert all(r["flips"] == 0 for r in s["flips_by_group"]["recompute_again"])  # the noise floor


def test_cases_needed_box_agrees_with_routing_and_gate(run_dir):
    s = json.loads((run_dir / "summary.json").read_text())
    rows = {(r["kind"], r["name"]): r for r in s["cases_needed"]}
    # one route per task family; at 40 cases a family is undecided at the 2-point margin, but the
    # planted 30% multi-hop loss is decided: both branches below are taken
    recommendation = {r["task"]: r["recommendation"] for r in s["routing"]}
    assert recommendation == {"aggregate": "undecided", "agreement": "undecided",
                              "multi_hop_bridge": "unsafe", "single_doc": "undecided"}
    assert {name for kind, name in rows if kind == "routing"} == {"aggregate", "agreement", "single_doc"}
    for route in s["routing"]:
        if route["recommendation"] == "undecided":
            need = rows[("routing", route["task"])]["needed"]
            assert need > route["n"] and f"about {need} cases needed" in route["reason"]
        else:
            assert ("routing", route["task"]) not in rows
    gate = {c["name"]: c for c in s["gate"]["checks"]}
    # both thresholds failed with their whole interval below the margin: no row; both noise floors
    # (recompute against itself, 40 and 120 cases) cannot judge yet: a row each, with a count
    others = {name: r for (kind, name), r in rows.items() if kind != "routing"}
    assert sorted(others) == ["multi-hop quality: noise floor (recompute_again)",
                              "overall quality: noise floor (recompute_again)"]
    for name, r in others.items():
        assert r["kind"] == "noise floor" and gate[name]["status"] == r["status"] == "error"
        assert r["needed"] > r["n"] and f"about {r['needed']} cases" in gate[name]["detail"]
    assert ("threshold", "multi-hop quality") not in rows and ("threshold", "overall quality") not in rows
    page = (run_dir / "report.html").read_text()
    assert page.index('id="cases-needed"') < page.index('<section id="audit">')


def test_coverage_of_a_dataset_card_is_figures_and_a_compact_table(tmp_path):
    from kvaudit.core.coverage import compute_coverage
    from kvaudit.core.dataset_format import Case, Segment

    pairs = make_pairs(n_per_task=8, leak_probes=0)
    segments = {s: Segment(s, "a b c d e") for p in pairs for s in p.segment_ids}
    cov = compute_coverage(segments, [Case(p.case_id, p.task, p.segment_ids, "q?", p.answers, strata=p.strata)
                                      for p in pairs])
    cov["strata"]["prefix_variant"][INJECT] = 1  # corpus-derived text in the card
    page = write_report(make_run(tmp_path, pairs, coverage=cov)).read_text()
    section = page[page.index('<section id="coverage">'):page.index('<section id="speed">')]
    for figure in ("coverage-refs-plot", "coverage-per-segment-plot", "coverage-shares-plot"):
        assert re.search(rf'id="{figure}"><svg', section), figure
    assert "refs_histogram" not in section and "{'refs'" not in section  # no flattened dump
    assert 'id="coverage-other"' not in section  # every key of compute_coverage has its place
    assert f"{100 * cov['never_cached_position_share']:.1f}%" in section
    assert "&lt;script&gt;" in section and INJECT not in section


def test_coverage_keys_the_report_does_not_know_are_listed_not_dropped(run_dir):
    page = (run_dir / "report.html").read_text()
    section = page[page.index('<section id="coverage">'):page.index('<section id="speed">')]
    assert 'id="coverage-other"' in section and "share_never_cached_position" in section


def test_audit_rows_show_four_states_and_never_pass_for_what_was_not_checked(run_dir):
    """pass, warn, fail, and "not run"/"does not apply": each row's badge is its check's state, as
    the audit CLI prints it (PASS, WARN, FAIL, -)."""
    import re

    page = (run_dir / "report.html").read_text()
    table = page[page.index('id="audit-table"'):page.index("</table>", page.index('id="audit-table"'))]
    badges = dict(re.findall(r'<tr><td>([a-z_]+)</td><td><span class="badge [a-z]+">([a-z ]+)</span>', table))
    checks = {c["name"]: c for c in json.loads((run_dir / "audit.json").read_text())["checks"]}
    assert set(badges) == set(checks)
    for name, c in checks.items():
        want = ("not run" if c["detail"].startswith("not run") else "does not apply") if c.get("not_applicable") \
            else "cannot judge" if c.get("cannot_judge") else "fail" if not c["passed"] \
            else "warn" if c.get("warning") else "pass"
        assert badges[name] == want, (name, c)
    assert "not run" in badges.values() and "does not apply" in badges.values()


def test_every_summary_key_is_documented():
    """summary.json's record (RunSummary) and its two descriptions agree: the module docstring's table
    and docs/reports.md's key list name every key."""
    from typing import get_type_hints

    from kvaudit.reports import summary

    keys = set(get_type_hints(summary.RunSummary))
    docs = (Path(__file__).resolve().parents[1] / "docs" / "reports.md").read_text()
    assert not {k for k in keys if f"`{k}`" not in docs}, "docs/reports.md lacks these summary.json keys"
    assert not {k for k in keys if f"``{k}``" not in (summary.__doc__ or "")}, "summary.py's docstring lacks these"
