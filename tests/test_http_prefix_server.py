"""The HTTP backend against a real ``vllm serve`` with plain prefix caching (no kvaudit connector).

What a team running stock vLLM can audit: the reference bypasses the cache by ``cache_salt``, the
prefix cache's cold / flushed / warm answers, tenant isolation and the timing side channel. The
server's own "reuse" of warmed documents is vacuous there, and the audit says so. One server at
vLLM's default block (conftest's session-scoped ``stock_server``) serves the module, on the
session's five Boxoffice cases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

from kvaudit.cli import main  # noqa: E402
from kvaudit.core.run_format import read_pairs  # noqa: E402
from kvaudit.reports.gate import judge  # noqa: E402

from .http_runs import checks, recorded_replay, run  # noqa: E402
from .lying_proxy import lying_proxy  # noqa: E402
from .sglang_standin import STANDIN_VERSION, sglang_standin  # noqa: E402

ARMS = "recompute,prefix_cache_cold,prefix_cache_flushed,prefix_cache,prefix_cache_other_tenant,recompute_again"


BLOCK = 128  # vLLM's default KV block on the CPU: the prefix cache keeps whole blocks


@pytest.fixture(scope="module")
def dataset(boxoffice5) -> Path:
    return boxoffice5


@pytest.fixture(scope="module")
def server(stock_server) -> str:
    return stock_server


def test_stock_prefix_caching_audits_with_its_security_probes(server, dataset, tmp_path):
    out = tmp_path / "run"
    assert run(server, dataset, out, ARMS) == 0
    code, c = checks(out)
    assert code == 0, {k: v["detail"] for k, v in c.items() if not v["passed"]}
    assert "reference and noise-floor requests found nothing cached" in c["server_cache_evidence"]["detail"]
    assert c["tenant_isolation"]["passed"] and "prefix cache: pass" in c["tenant_isolation"]["detail"]
    pairs = read_pairs(out)
    for p in pairs:  # the flushed arm found nothing (the reset emptied the cache); warm found the prompt
        assert p.arms["prefix_cache_flushed"].tokens_reused == 0
        assert p.arms["prefix_cache"].tokens_reused >= (p.n_prompt_tokens - 1) // BLOCK * BLOCK > 0
        assert p.arms["prefix_cache_other_tenant"].tokens_reused == 0
    assert main(["report", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    cfw = summary["security"]["cold_flushed_warm"]
    assert cfw["n"] == 5 and sum(cfw["counts"].values()) == 5


def test_sglangs_native_api_audits_its_prefix_cache_and_namespaces(server, dataset, tmp_path):
    """SGLang's dialect (its native /generate: ids in, ids and id-keyed log-probabilities out, extra_key
    namespaces, /flush_cache) over a real engine (tests/sglang_standin.py): probed at open and recorded,
    the cold, flushed, warm and other-tenant arms audited as on vLLM's own API."""
    out = tmp_path / "run"
    with sglang_standin(server) as url:  # the prefix arms on two cases (the noise floor is vLLM's own: not rerun)
        assert run(url, dataset, out, ARMS.removesuffix(",recompute_again"), "--limit", "2") == 0
        code, c = checks(out)
    # SGLang echoes the prompt ids only where no prefix may match (logprob_start_len 0), and its /generate
    # names no model: what the cache arms consumed, and from which model, cannot be shown (as on
    # llama.cpp for the ids): cannot judge, which a policy may accept ([audit] accept_cannot_judge)
    unjudged = {"server_consumed_ids", "server_model"}
    assert code == 2 and all(c[k].get("cannot_judge") for k in unjudged)
    assert "prompt-token counts equal kvaudit's on 10 of them" in c["server_consumed_ids"]["detail"]
    assert all(v["passed"] for k, v in c.items() if k not in unjudged and v["required"]), c
    policy = tmp_path / "sglang.toml"
    policy.write_text('arm = "prefix_cache"\n[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n'
                      '[audit]\naccept_cannot_judge = ["server_consumed_ids", "server_model"]\n')
    judged = judge(out, policy)
    rows = {r.kind: r for r in judged.results}
    assert rows["audit"].status == "pass" and rows["audit"].observed == "passed except accepted unjudged"
    assert judged.verdict == "error" and rows["delta"].status == "error"  # 2 cases: no bound
    backend = json.loads((out / "manifest.json").read_text())["backend"]
    probe = backend["cache_probe"]
    assert backend["server_model"]["version"] == STANDIN_VERSION  # from /server_info: SGLang has no /version
    assert probe["dialect"] == "sglang" and probe["namespace"] == "extra_key" and probe["logprobs_keyed_by"] == "token ids"
    assert probe["salt_isolates"] and probe["bypass"] == "fresh extra_key" and probe["reset_empties"]
    assert c["tenant_isolation"]["passed"]
    for p in read_pairs(out):
        assert p.arms["prefix_cache_flushed"].tokens_reused == 0 and p.arms["prefix_cache_other_tenant"].tokens_reused == 0
        assert p.arms["prefix_cache"].tokens_reused >= (p.n_prompt_tokens - 1) // BLOCK * BLOCK > 0


def test_without_namespaces_another_tenant_is_served_the_cached_prompt(server, dataset, tmp_path):
    """--no-cache-namespace: SGLang audited as a deployment that sends no extra_key. The probe finds
    one shared cache, the reference bypasses it per request (logprob_start_len 0), the cold arm
    runs right after a flush, and another tenant's identical prompt is served from the cache:
    tenant_isolation fails, a real finding, not a refusal."""
    out = tmp_path / "run"
    with sglang_standin(server) as url:
        assert run(url, dataset, out, "recompute,prefix_cache_cold,prefix_cache,prefix_cache_other_tenant",
                   "--limit", "1", "--no-cache-namespace") == 0
        code, c = checks(out)
    probe = json.loads((out / "manifest.json").read_text())["backend"]["cache_probe"]
    assert probe["namespace"] is None and probe["caching"] and not probe["salt_isolates"]
    assert probe["bypass"].startswith("logprob_start_len 0") and probe["reset_empties"]
    p = read_pairs(out)[0]
    assert p.arms["prefix_cache_cold"].tokens_reused == 0 and p.arms["prefix_cache_other_tenant"].tokens_reused > 0
    assert code == 2 and not c["tenant_isolation"]["passed"]


def test_the_servers_own_reuse_of_warmed_documents_is_shown_vacuous(server, dataset, tmp_path):
    out = tmp_path / "run"
    assert run(server, dataset, out, "recompute,reuse,prefix_cache_cold", "--limit", "2") == 0
    first = read_pairs(out)[0]
    # the reuse arm's own requests must not warm the prefix chain: the cold arm is a first arrival
    assert first.arms["prefix_cache_cold"].tokens_reused < first.n_prompt_tokens // 2
    code, c = checks(out)
    assert code == 1
    assert not c["server_cache_evidence"]["passed"] and "has no segment reuse" in c["server_cache_evidence"]["detail"]
    assert c["identity_control"].get("cannot_judge")  # a black box cannot be fed in-context KV


# ---------------------------------------------------------------- servers that lack a feature
# Each was a wrong or vacuous verdict before engine dialects (a stand-in strips the feature from
# the real server's answers): refused now before any case, naming what is missing.


@pytest.mark.parametrize("mode, arms, extra, says", [
    # generated text but no ids: every arm's answer read as empty, and the noise floor "passed"
    ("no_token_ids", "recompute,recompute_again", (), "showed none of its token ids"),
    # first-token log-probabilities keyed by text (SGLang's OpenAI server): unusable
    ("text_logprobs", "recompute,recompute_again", (), "keyed by text, not token id"),
    # one cache for every salt: the server's reuse counted exact prefix hits as segment reuse
    ("shared_salt", "recompute,reuse", ("--reference-url", "REAL"), "does not isolate cache_salt"),
])
def test_a_server_lacking_a_feature_is_refused_naming_it(server, dataset, tmp_path, capsys, mode, arms, extra, says):
    out = tmp_path / "run"
    with lying_proxy(server, mode) as url:
        assert run(url, dataset, out, arms, *[server if x == "REAL" else x for x in extra]) == 2
    assert says in capsys.readouterr().err
    assert not (out / "pairs.jsonl").exists()


def test_errors_about_the_reference_name_the_reference_server(server, dataset, tmp_path, capsys):
    with lying_proxy(server, "text_logprobs") as ref:
        assert run(server, dataset, tmp_path / "run", "recompute,prefix_cache_cold", "--reference-url", ref) == 2
    err = capsys.readouterr().err
    assert f"reference server {ref}" in err and "not keyed by token id" in err


def test_a_cold_arm_on_a_shared_cache_starts_from_a_reset_even_after_an_earlier_run(server, dataset, tmp_path):
    """Salts that do not isolate: an earlier run's prompts are in the cache. The cold arm is sent
    after a reset and finds nothing; the warm arm finds the prompt."""
    with lying_proxy(server, "shared_salt") as url:
        for name in ("first", "second"):
            out = tmp_path / name
            assert run(url, dataset, out, "recompute,prefix_cache_cold,prefix_cache", "--reference-url", server,
                       "--limit", "2") == 0
            for p in read_pairs(out):
                assert p.arms["prefix_cache_cold"].tokens_reused == 0 and p.arms["prefix_cache_cold"].engine["cache_reset"]
                assert p.arms["prefix_cache"].tokens_reused > p.n_prompt_tokens // 2
        code, c = checks(tmp_path / "second")
    assert c["server_cache_evidence"]["passed"], c["server_cache_evidence"]["detail"]


def test_a_server_that_echoes_nothing_cannot_pass_the_ids_check(server, dataset, tmp_path):
    out = tmp_path / "run"
    with lying_proxy(server, "no_echo") as url:
        assert run(url, dataset, out, "recompute,prefix_cache_cold,prefix_cache", "--limit", "2") == 0
    code, c = checks(out)
    assert code == 2 and c["server_consumed_ids"].get("cannot_judge")
    assert "prompt-token counts equal kvaudit's" in c["server_consumed_ids"]["detail"]


def test_the_cache_probe_fills_the_default_cpu_block(server, dataset, tmp_path):
    """vLLM's CPU default block is 128 tokens: a 96-token probe found nothing cached there and the
    prefix-cache arms were refused naming flags the server already had."""
    out = tmp_path / "run"
    assert run(server, dataset, out, "recompute,prefix_cache_cold,prefix_cache", "--limit", "1") == 0
    probe = json.loads((out / "manifest.json").read_text())["backend"]["cache_probe"]
    assert probe["caching"] and probe["cached_tokens"][1] >= BLOCK


def test_an_open_loop_replay_sends_each_request_at_its_arrival_and_sweeps_loads(server, tmp_path):
    """Open loop on a server: each request goes out at its arrival whatever is in flight (the
    server batches them), never held for a wave; two loads on the one server, each recorded with
    its TTFT against offered load."""
    from kvaudit.core.replay_format import ReplayDir

    wl = tmp_path / "w.jsonl"
    assert main(["generate", "workload", "--out", str(wl), "--requests", "5", "--documents", "4", "--queries", "3",
                 "--docs-per-request", "2", "--doc-tokens", "uniform:30:50", "--no-progress"]) == 0
    out = tmp_path / "replay"
    assert main(["replay", "--backend", "openai", "--base-url", server, "--workload", str(wl), "--cache-policy",
                 "recompute", "--cache-budget", "1MB", "--rate", "4,50", "--max-new-tokens", "4", "--out", str(out),
                 "--no-progress"]) == 0
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["schedule"] == "arrivals" and [row["rate"] for row in sweep["loads"]] == [4, 50]
    recs = ReplayDir(out / "rate-50").read_requests()
    assert sorted(r.index for r in recs) == list(range(5))
    # sent at arrival (not held behind requests in flight), so another request was still running
    assert max(r.queue_s for r in recs) < 0.1
    by_arrival = sorted(recs, key=lambda r: r.arrival_s)
    assert any(b.arrival_s < a.finish_s for a, b in zip(by_arrival, by_arrival[1:])), "no two requests overlapped"
    assert all(r.decode_tokens >= 1 and r.ttft_s >= r.client_request_ttft_s for r in recs)


def test_a_request_longer_than_the_servers_context_refuses_the_replay(server, tmp_path, capsys):
    """The server holds 4,096 tokens (its --max-model-len): a 4.4K-token request is not served with
    a document dropped, the replay is refused before any request, naming it."""
    wl = tmp_path / "long.jsonl"
    assert main(["generate", "workload", "--out", str(wl), "--requests", "2", "--documents", "3",
                 "--docs-per-request", "3", "--doc-tokens", "uniform:1450:1500", "--no-progress"]) == 0
    capsys.readouterr()
    out = tmp_path / "replay"
    assert main(["replay", "--backend", "openai", "--base-url", server, "--workload", str(wl), "--cache-policy",
                 "recompute", "--cache-budget", "1MB", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{wl}: 2 request(s) need more prompt tokens than the engine takes" in err
    assert "the server's context length less the answer tokens" in err and "r0000001 (" in err
    assert not (out / "requests.jsonl").exists()


def test_a_replay_asks_the_server_for_no_log_probabilities(server, tmp_path):
    """A replay reads tokens and times only: its requests ask for no log-probabilities (asking
    costs a loaded server requests a second), while the backend's own probes at open still ask
    the audit's top-20; the answers' tokens are still read."""
    recs, replayed, seen = recorded_replay(server, tmp_path)
    assert len(replayed) == 3 and not any("logprobs" in b for b in replayed)
    assert any(b.get("logprobs") == 20 for b in seen[: len(seen) - 3])  # the probes at open ask
    assert sum(r.decode_tokens for r in recs) >= 1  # answers' ids read without log-probabilities


def test_replications_serve_each_load_again_with_new_arrivals_and_bound_its_percentiles(server, tmp_path, capsys):
    """--replications 6 at one load on the server: six replays with arrival seeds 0-5, each into
    its own folder; the load's percentiles are the median over them with an interval both of whose
    ends are bounded (lowest and highest); the same command again serves nothing new."""
    from kvaudit.core.replay_format import ReplayDir
    from kvaudit.stats.replications import median_interval

    wl = tmp_path / "w.jsonl"
    assert main(["generate", "workload", "--out", str(wl), "--requests", "2", "--documents", "4", "--queries", "2",
                 "--docs-per-request", "2", "--doc-tokens", "uniform:30:50", "--no-progress"]) == 0
    out = tmp_path / "replay"
    cmd = ["replay", "--backend", "openai", "--base-url", server, "--workload", str(wl), "--cache-policy",
           "recompute", "--cache-budget", "1MB", "--rate", "20", "--replications", "6", "--seed", "3",
           "--out", str(out), "--no-progress"]
    assert main(cmd) == 0
    printed = capsys.readouterr().out
    assert "6 replications each" in printed and "the median over its 6 replications" in printed
    (row,) = json.loads((out / "sweep.json").read_text())["loads"]
    assert [r["seed"] for r in row["replications"]] == list(range(3, 9))
    summaries = [ReplayDir(out / r["dir"]).read_summary() for r in row["replications"]]
    assert len({s["config"]["arrivals"] for s in summaries}) == 6  # six arrival draws
    p95 = [s["ttft_s"]["p95"]["value"] for s in summaries]
    assert row["ttft_s"]["p95"] == median_interval(p95) and row["intervals_claimed"] and row["requests"] == 12
    assert row["ttft_s"]["p95"]["low"] == min(p95) and row["ttft_s"]["p95"]["high"] == max(p95)
    mtimes = {r["dir"]: (out / r["dir"] / "requests.jsonl").stat().st_mtime_ns for r in row["replications"]}
    assert main(cmd) == 0  # finished: nothing served again, the same sweep
    assert {r["dir"]: (out / r["dir"] / "requests.jsonl").stat().st_mtime_ns for r in row["replications"]} == mtimes
    assert json.loads((out / "sweep.json").read_text())["loads"][0]["ttft_s"] == row["ttft_s"]
    assert main(["report", str(out)]) == 0
    assert "(6 replications)" in (out / "replays.html").read_text()
