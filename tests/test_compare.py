"""`kvaudit compare` on synthetic runs: grouping by dataset, numbers equal to each run's own
Analysis and gate, clear errors for bad input, a self-contained page that escapes run text."""

from __future__ import annotations

import html
import json
import re

import pytest

from kvaudit import cli
from kvaudit.audit.trust import build_audit
from kvaudit.core.audit_format import write_audit
from kvaudit.core.jsonio import read_json, write_json
from kvaudit.reports.analysis import Analysis, load_run
from kvaudit.reports.compare import build_comparison, write_comparison
from kvaudit.reports.gate import judge
from kvaudit.reports.policy import load_policy
from kvaudit.reports.summary import routing
from kvaudit.testing.synthetic import make_pairs, make_run

INJECT = '<script>document.title="PWNED"</script><img src=x onerror=alert(1)>'


def _edit_manifest(run, **dataset):
    """Change the manifest's dataset fields, then audit again (the audit binds the manifest)."""
    m = read_json(run / "manifest.json")
    if "hash" in dataset:
        m["identity"]["dataset_hash"] = dataset["hash"]
    m["dataset"].update(dataset)
    write_json(run / "manifest.json", m)
    write_audit(run, build_audit(run))
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    a = make_run(d / "a", n_per_task=20, n_docs=12, seed=0)
    b = make_run(d / "b", n_per_task=24, n_docs=14, seed=1,
                 loss={"single_doc": 0.0, "multi_hop_bridge": 0.1, "aggregate": 0.0, "agreement": 0.05})
    other = make_run(d / "other", n_per_task=15, n_docs=12, seed=2,
                     loss={"single_doc": 0.05, "multi_hop_compare": 0.2})
    _edit_manifest(other, hash="f" * 32, name="other-set")
    return [a, b, other]


@pytest.fixture(scope="module")
def written(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    return write_comparison(runs, out)


def test_two_datasets_give_two_groups(written, runs):
    c = json.loads(written[0].read_text())
    assert [g["dataset_hash"] for g in c["groups"]] == ["0" * 32, "f" * 32]
    assert [[r["run"] for r in g["rows"]] for g in c["groups"]] == [[str(runs[0]), str(runs[1])], [str(runs[2])]]
    assert c["groups"][0]["families"] == ["aggregate", "agreement", "multi_hop_bridge", "single_doc"]
    assert c["groups"][1]["families"] == ["multi_hop_compare", "single_doc"]
    assert c["groups"][1]["datasets"] == ["other-set"]
    page = written[1].read_text()
    assert page.count('<table class="compare-table"') == 2
    # the other dataset's family only appears in its own table
    first, second = page.split('id="group-2"')
    assert "multi_hop_compare" not in first and "multi_hop_compare" in second


def test_numbers_match_each_runs_own_analysis_gate_and_routing(written, runs):
    c = json.loads(written[0].read_text())
    policy = load_policy()
    rows = [r for g in c["groups"] for r in g["rows"]]
    assert len(rows) == 3
    for row, run_dir in zip(rows, runs, strict=True):
        an = Analysis(load_run(run_dir), confidence=policy.confidence, min_icc=policy.min_icc)
        assert row["arm"] == policy.arm == "reuse"
        ov = an.delta("reuse", "overall")
        assert row["overall"]["delta"] == pytest.approx(ov.delta)
        assert row["overall"]["ci"] == pytest.approx(ov.ci)
        for task in an.tasks:
            d = an.delta("reuse", f"task:{task}")
            fam = row["families"][task]
            assert fam["n"] == d.n and fam["delta"] == pytest.approx(d.delta)
            assert (fam["ci"] is None) == (d.ci is None)
            if d.ci:
                assert fam["ci"] == pytest.approx(d.ci)
                assert fam["lower_bound"] == pytest.approx(d.lower_bound)
            assert fam["decidable"] == d.decidable and fam["reason"] == d.reason
        assert row["flips"]["flips"] == an.flips("reuse").flips
        assert row["hit_rate"]["segment"] == pytest.approx(an.hit_rate("reuse", "segment"))
        assert row["speedup"]["ratio_of_medians"] == pytest.approx(an.speedup("reuse")["ratio_of_medians"])
        judged = judge(run_dir)
        verdict, results = judged.verdict, judged.results
        assert row["gate"]["verdict"] == verdict
        assert [ch["status"] for ch in row["gate"]["checks"]] == [r.status for r in results]
        assert {t: f["recommendation"] for t, f in row["families"].items()} == {
            r["task"]: r["recommendation"] for r in routing(an, policy)}


def test_one_row_per_run_and_arm_and_missing_arms_are_named(runs, tmp_path):
    c = build_comparison(runs[:2], arms=["reuse", "identity", "blend@0.15"])
    assert [(r["run"], r["arm"]) for r in c["groups"][0]["rows"]] == [
        (str(runs[0]), "reuse"), (str(runs[0]), "identity"), (str(runs[1]), "reuse"), (str(runs[1]), "identity")]
    identity = c["groups"][0]["rows"][1]
    assert identity["overall"]["delta"] == 0.0 and identity["flips"]["flips"] == 0
    assert [(s["run"], s["arm"]) for s in c["skipped"]] == [(str(runs[0]), "blend@0.15"), (str(runs[1]), "blend@0.15")]
    assert "not in this run" in c["skipped"][0]["reason"]


def test_a_run_without_a_dataset_hash_is_a_group_of_its_own(tmp_path):
    a = make_run(tmp_path / "a", n_per_task=5, n_docs=10, leak_probes=0)
    b = make_run(tmp_path / "b", n_per_task=5, n_docs=10, leak_probes=0)
    for run in (a, b):
        m = read_json(run / "manifest.json")
        del m["identity"]["dataset_hash"], m["dataset"]["hash"]
        write_json(run / "manifest.json", m)
    c = build_comparison([a, b])
    assert len(c["groups"]) == 2 and all(g["dataset_hash"] is None for g in c["groups"])


def test_cli_writes_both_files_and_bad_input_exits_2(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert cli.main(["compare", str(runs[0]), str(runs[2]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / "compare.html"), str(out / "compare.json")]
    assert sorted(p.name for p in out.iterdir()) == ["compare.html", "compare.json"]  # no temp files left

    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    for argv, message in (
        ([str(runs[0]), str(not_a_run)], "manifest"),
        ([str(runs[0]), str(tmp_path / "nowhere")], "run directory not found"),
        ([str(runs[0]), str(runs[0])], "given twice"),
        ([str(runs[0]), "--policy", str(tmp_path / "nope.toml")], "policy file not found"),
    ):
        assert cli.main(["compare", *argv, "--out", str(tmp_path / "bad")]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("kvaudit: error: ") and message in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "bad").exists()  # nothing half-written


def test_page_is_self_contained_and_escapes_run_text(tmp_path):
    pairs = make_pairs(n_per_task=12, n_docs=12, loss={INJECT: 0.3, "single_doc": 0.0}, injected=INJECT)
    run = make_run(tmp_path / "run", pairs)
    m = read_json(run / "manifest.json")
    m["identity"]["model"] = f"model{INJECT}"
    write_json(run / "manifest.json", m)
    _edit_manifest(run, name=f"set{INJECT}")
    _, page_path = write_comparison([run], tmp_path / "out")
    page = page_path.read_text()
    assert "<script" not in page and "<img" not in page
    for name in ("<th class=\"family\">&lt;script&gt;", "set&lt;script&gt;", "model&lt;script&gt;"):
        assert name in page, name  # family, dataset and model names shown as text
    assert not re.search(r'(src|href)\s*=\s*"?(https?:)?//', page) and "@import" not in page
    assert not re.search(r"url\((?!#)", page)  # only the SVG's own clip paths
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page)[1])
    assert csp.startswith("default-src 'none'") and "script-src" not in csp
    assert re.search(r'id="compare-forest-1"><svg', page)


@pytest.mark.parametrize("started, says", [
    (["2026-12-04T10:00:00+00:00", "2026-12-04T12:30:00+00:00"], "these runs started 2.5 hours apart"),
    (["2026-12-04T10:00:00+00:00", None], "some of these runs do not record when they started"),
    (["2026-12-04T10:00:00+00:00", "2026-12-04T10:20:00+00:00"], None),
])
def test_runs_not_made_side_by_side_are_flagged_and_each_speedup_shows_its_noise(tmp_path, started, says):
    """Issue 42: rows of runs made hours apart say so; every speed-up is shown beside its own run's
    noise floor speed-up (recompute_again over recompute: identical work)."""
    runs = []
    for k, when in enumerate(started):
        run = make_run(tmp_path / f"r{k}", n_per_task=20, n_docs=12, seed=k)
        m = read_json(run / "manifest.json")
        m["sessions"] = [{"started": when}] if when else []
        write_json(run / "manifest.json", m)
        write_audit(run, build_audit(run))
        runs.append(run)
    c = build_comparison(runs)
    assert c["groups"][0]["apart"] == says
    assert all(r["noise_speedup"] is not None for r in c["groups"][0]["rows"])
    _, html_path = write_comparison(runs, tmp_path / "out")
    page = html_path.read_text()
    assert ("Not run side by side:" in page) == (says is not None)
    assert "noise floor" in page
