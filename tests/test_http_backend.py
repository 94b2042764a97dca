"""The HTTP backend against a real ``vllm serve`` running kvaudit's connector (``--kv-transfer-config``).

Skipped where vLLM is not importable (the main ``.venv``); ``make test`` runs it in
``.venv-vllm``. One server (SmolLM2, fp32, 127.0.0.1, a free port; conftest's session-scoped
``connector_server``) serves the module, on the session's five Boxoffice cases. The positive path
is the real server; the negative tests put a lying stand-in (:mod:`tests.lying_proxy`) in front of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

from kvaudit.cli import main  # noqa: E402
from kvaudit.core.run_format import read_pairs  # noqa: E402

from .lying_proxy import lying_proxy  # noqa: E402

ARMS = ("recompute,reuse,identity,reuse_other_tenant,prefix_cache_cold,prefix_cache_flushed,prefix_cache,"
        "prefix_cache_other_tenant,recompute_again")


@pytest.fixture(scope="module")
def dataset(boxoffice5) -> Path:
    return boxoffice5


@pytest.fixture(scope="module")
def server(connector_server) -> str:
    return connector_server


def http_run(url: str, dataset: Path, out: Path, arms: str, *extra: str) -> int:
    return main(["run", "--backend", "openai", "--base-url", url, "--reuse-protocol", "kvaudit",
                 "--dataset", str(dataset), "--out", str(out), "--arms", arms, "--max-new-tokens", "8",
                 "--no-progress", *extra])


@pytest.fixture(scope="module")
def run_dir(server, dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("http_run") / "run"
    assert http_run(server, dataset, out, ARMS) == 0
    return out


def audit(run: Path) -> dict:
    code = main(["audit", str(run)])
    obj = json.loads((run / "audit.json").read_text())
    return {"code": code, "checks": {c["name"]: c for c in obj["checks"]}}


def test_a_server_run_audits_like_an_in_process_run(run_dir):
    a = audit(run_dir)
    assert a["code"] == 0, {k: v["detail"] for k, v in a["checks"].items() if not v["passed"]}
    c = a["checks"]
    assert "echoed exactly kvaudit's prompt ids" in c["server_consumed_ids"]["detail"]
    assert "loaded exactly [head][segments]" in c["server_cache_evidence"]["detail"]
    assert c["identity_control"]["passed"] and "answers equal on 5 of 5" in c["identity_control"]["detail"]
    # fingerprints came back through kv_transfer_params: history is judged, not skipped
    assert c["history_independence"]["passed"] and not c["history_independence"].get("cannot_judge")
    # the leak probe's candidates were scored over HTTP on the arms' own KV
    assert "rank test" in c["leak_probes"]["detail"]
    pairs = read_pairs(run_dir)
    probe = [p for p in pairs if p.canary][0]
    assert set(probe.arms["reuse"].canary_logprobs) == {probe.canary["value"], *probe.canary["decoys"]}
    # kvaudit's connector store is keyed by content hashes, not tenants: another tenant that
    # sends the same load plan is served the segments. The probe finds it; the prefix cache is isolated.
    iso = c["tenant_isolation"]
    assert not iso["passed"] and "segment reuse: fail" in iso["detail"] and "prefix cache: pass" in iso["detail"]


def test_the_report_shows_the_security_probes_and_the_gate_judges_them(run_dir, tmp_path):
    audit(run_dir)
    assert main(["report", str(run_dir)]) == 0
    html = (run_dir / "report.html").read_text()
    for table in ("isolation-table", "timing-table", "cold-flushed-warm-table"):
        assert f'id="{table}"' in html
    summary = json.loads((run_dir / "summary.json").read_text())
    timing = {t["what"]: t for t in summary["security"]["timing"]}
    # on this CPU server a prefix-cache hit is several times faster than a miss (5 cases: the
    # interval is wide, and other work on the machine adds noise, so only its direction is asserted)
    t = timing["prefix cache"]
    assert t["n"] == 5 and t["lower"] <= t["auc"] <= t["upper"]
    assert t["median_hit_s"] < t["median_miss_s"] and t["auc"] > 0.5 and t["requests_needed"] is not None
    policy, gate = tmp_path / "policy.toml", tmp_path / "gate.md"
    quality = '[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n'  # every policy checks quality
    policy.write_text(quality + "[audit]\nrequire_passed = true\n")
    # the audit passes, but 5 cases on fewer than 10 documents decide no quality threshold: cannot judge
    assert main(["gate", str(run_dir), "--policy", str(policy), "--markdown", str(gate)]) == 2
    assert "| audit passed | ✅ pass |" in gate.read_text()
    policy.write_text(quality + "[audit]\nrequire_passed = true\n[security]\nrequire_tenant_isolation = true\n")
    assert main(["gate", str(run_dir), "--policy", str(policy)]) == 1  # the isolation failure is a decision


def test_http_recompute_answers_equal_the_in_process_vllm_backends(run_dir, vllm_run):
    """The same five cases, the same engine settings: the server's reference answers are the
    in-process engine's, token for token, from the same ids."""
    http = {p.case_id: p.arms["recompute"] for p in read_pairs(run_dir)}
    local = {p.case_id: p.arms["recompute"] for p in read_pairs(vllm_run)}
    assert len(local) == 5 and set(http) == set(local)
    for case_id, res in local.items():
        assert res.ids_hash == http[case_id].ids_hash  # the same ids reached both engines
        assert res.answer_ids == http[case_id].answer_ids, case_id
        assert [t for t, _ in res.top_k] == [t for t, _ in http[case_id].top_k], case_id


@pytest.mark.parametrize("mode, failing", [("cached", "server_cache_evidence"), ("drop", "server_consumed_ids")])
def test_a_server_that_lies_fails_the_audit(server, dataset, tmp_path, mode, failing):
    with lying_proxy(server, mode) as url:
        out = tmp_path / "run"
        assert http_run(url, dataset, out, "recompute,reuse,identity", "--limit", "2") == 0
    a = audit(out)
    assert a["code"] == 1
    assert not a["checks"][failing]["passed"] and not a["checks"][failing].get("cannot_judge")


def test_arms_a_black_box_cannot_run_are_refused_before_any_case(server, dataset, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--backend", "openai", "--base-url", server, "--dataset", str(dataset), "--out", str(out),
                 "--arms", "recompute,identity", "--no-progress"])
    assert code == 2
    assert "needs --reuse-protocol kvaudit" in capsys.readouterr().err
    assert not (out / "pairs.jsonl").exists()


def test_a_case_failing_while_its_candidates_are_scored_leaves_no_arm_kv_in_the_servers_store(
        server, dataset, tmp_path, capsys):
    from kvaudit.core.errors import KvauditError
    from kvaudit.runners.engines.http.client import ServerClient

    seen: list[dict] = []
    with lying_proxy(server, "fail_scoring", seen) as url:
        code = http_run(url, dataset, tmp_path / "run", "recompute")
    assert code == 2
    assert "answered 500" in capsys.readouterr().err
    saved = [k for b in seen for k, _, _ in (b.get("kv_transfer_params") or {}).get("save", [])
             if k.startswith("tmp:arm:")]
    assert saved, "the leak-probe case's arm saved no KV to score on"
    c = ServerClient(server)
    for i, key in enumerate(saved):  # each arm's KV is gone: a plan that loads it fails
        prompt = next(b["prompt"] for b in seen if [key, 0, len(b["prompt"]) - 1] in
                      (b.get("kv_transfer_params") or {}).get("save", []))
        with pytest.raises(KvauditError, match="failed on the server|answered 5|error in the response"):
            c.complete(prompt, max_tokens=1, salt=f"probe-{i}", kv_transfer_params={
                "kvaudit": "run", "n_load": len(prompt) - 1, "plan": [[key, 0, False]]})
    c.close()


def test_a_load_plan_naming_missing_kv_fails_that_request_not_the_server(server):
    from kvaudit.core.errors import KvauditError
    from kvaudit.runners.engines.http.client import ServerClient

    c = ServerClient(server)
    ids = list(range(1000, 1200))
    with pytest.raises(KvauditError, match="failed on the server|answered 5|error in the response"):
        c.complete(ids, max_tokens=2, salt="a-fresh-salt", kv_transfer_params={
            "kvaudit": "run", "n_load": 64, "plan": [["no-such-entry", 0, False]]})
    ok = c.complete(ids, max_tokens=2, salt="another-fresh-salt")  # the engine is still serving
    assert len(ok.token_ids) == 2 and ok.prompt_ids == ids
    c.close()



def test_concurrent_cases_over_http_audit_like_one_at_a_time(server, dataset, run_dir, tmp_path):
    """Three cases at a time, their requests in flight together: the run audits, its security
    findings and answers match the one-at-a-time run's, and the manifest says how it ran."""
    from kvaudit.core.manifest import read_manifest

    out = tmp_path / "run"
    # the arms whose checks are compared, and the noise floor the identity check needs
    arms = "recompute,reuse,identity,reuse_other_tenant,prefix_cache,prefix_cache_other_tenant,recompute_again"
    assert http_run(server, dataset, out, arms, "--concurrent-cases", "3") == 0
    a = audit(out)
    assert a["code"] == 0, {k: v["detail"] for k, v in a["checks"].items() if not v["passed"]}
    seq = audit(run_dir)["checks"]
    for name in ("server_consumed_ids", "server_cache_evidence", "identity_control", "history_independence"):
        assert a["checks"][name]["passed"] == seq[name]["passed"], name
    iso = a["checks"]["tenant_isolation"]["detail"]
    assert "segment reuse: fail" in iso and "prefix cache: pass" in iso
    m = read_manifest(out)
    assert m.identity.concurrent_cases == 3 and m.backend["batching"]["concurrent_cases"] == 3
    n_arms = len(arms.split(","))
    groups = m.backend["batching"]["groups"]  # 5 cases: a group of 3, then of 2, for every arm's step
    assert set(groups) == {"2", "3"} and groups["2"] == groups["3"] >= n_arms, groups
    # warm-ups overlap across the group's threads: caching counts their wall time once, so no share is negative
    assert m.timing_s["caching"] > 0 and all(v >= 0 for v in m.timing_s.values()), m.timing_s
    one = {p.case_id: p for p in read_pairs(run_dir)}
    for p in read_pairs(out):
        for name in ("recompute", "identity", "reuse"):
            assert p.arms[name].answer_ids == one[p.case_id].arms[name].answer_ids, (p.case_id, name)
    # each pair names the cases it ran with: speed is judged per batch (3, then 2), not per case
    assert [p.batch for p in read_pairs(out)] == ["0.0"] * 3 + ["0.1"] * 2
    assert all(p.batch is None for p in read_pairs(run_dir))  # one at a time: each case alone
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "Cases ran 3 at a time" in page and "None requests" not in page
