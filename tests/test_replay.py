"""`kvaudit replay`: the replay directory's records and resume, the percentile intervals' coverage
(a fast slice of benchmarks/replay_percentiles.py), the engine-order simulator, and a real
SmolLM2 replay on the transformers backend held to the simulator.

The vLLM replays (prefix caching under a budget, the segment store on vLLM's connector) are in
tests/test_replay_vllm.py, run in .venv-vllm.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np
import pytest

from kvaudit.cli import main
from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.replay_format import ReplayConfig, ReplayDir, RequestRecord
from kvaudit.core.trace import trace_from_requests
from kvaudit.simulator.segment_cache import simulate_segment, simulate_segment_store
from tests.conftest import load_benchmark


def _config(**kw) -> ReplayConfig:
    base = dict(workload="w.jsonl", workload_hash="h", policy="segment", budget_bytes=10, model="smollm2",
                backend="transformers", concurrency=1, max_new_tokens=1, n_requests=3)
    return ReplayConfig(**{**base, **kw})


def test_a_replay_of_something_else_is_refused(tmp_path):
    d = ReplayDir(tmp_path / "r")
    d.path.mkdir()
    d.write_config(_config())
    d.check_resumable(_config(workload="moved/w.jsonl"))  # the file may move; its hash may not
    for change, field in ((dict(policy="prefix"), "policy"), (dict(budget_bytes=11), "budget_bytes"),
                          (dict(workload_hash="other"), "workload_hash")):
        with pytest.raises(KvauditError, match=f"holds a replay with {field}="):
            d.check_resumable(_config(**change))


# a request record with only the fields every replay writes
MINIMAL_RECORD = dict(index=0, request_id="r0", wave=0, session=0, n_prompt_tokens=10, head_tokens=2, segment_tokens=6,
                      ttft_s=0.1, warmup_s=0.0, head_s=0.0, queue_s=0.0, prefix_cache_tokens=0, segment_hit_tokens=6,
                      warmup_tokens=0, tokens_computed=4, evictions=0.0, wall_s=0.1, ids_hash="x")


def test_request_records_are_read_typed_and_a_torn_tail_is_mended(tmp_path):
    d = ReplayDir(tmp_path)
    rec = MINIMAL_RECORD
    d.requests_file.write_text(json.dumps(rec) + "\n" + json.dumps({**rec, "index": 1})[:40])
    assert [r.index for r in d.finished()] == [0]  # the torn second line is cut, to be served again
    assert d.requests_file.read_text().endswith("\n")
    d.requests_file.write_text(json.dumps({**rec, "ttft_s": "fast"}) + "\n")
    with pytest.raises(DatasetError, match=r"requests.jsonl, line 1: field 'ttft_s' must be a number, got str"):
        d.read_requests()


def test_gzipped_request_records_read_as_the_plain_ones_and_a_broken_one_is_named(tmp_path):
    import gzip

    from kvaudit.core.replay_format import read_request_records

    rec = MINIMAL_RECORD
    text = "".join(json.dumps({**rec, "index": i}) + "\n" for i in range(3))
    (tmp_path / "requests.jsonl").write_text(text)
    (tmp_path / "r-requests.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    plain = read_request_records(tmp_path / "requests.jsonl")
    assert [r.index for r in plain] == [0, 1, 2] and read_request_records(tmp_path / "r-requests.jsonl.gz") == plain
    (tmp_path / "bad-requests.jsonl.gz").write_bytes(gzip.compress(text.encode())[:-9])
    with pytest.raises(DatasetError, match=r"bad-requests.jsonl.gz: not a readable gzip file"):
        read_request_records(tmp_path / "bad-requests.jsonl.gz")
    (tmp_path / "typed-requests.jsonl.gz").write_bytes(gzip.compress(json.dumps({**rec, "ttft_s": "x"}).encode()))
    with pytest.raises(DatasetError, match=r"typed-requests.jsonl.gz, line 1: field 'ttft_s' must be a number"):
        read_request_records(tmp_path / "typed-requests.jsonl.gz")


def test_percentile_intervals_cover_at_the_stated_level():
    bench = load_benchmark("replay_percentiles")
    rows = bench.coverage_grid(reps=300, seed=1, sizes=(60, 400), quantiles=(0.5, 0.95))
    for row in rows:
        # covered, or undecided (an end the sample cannot bound counts as covering on that side)
        assert row["coverage"] >= 0.95 - 3 * row["mc_se"], row


def test_intervals_on_queued_requests_are_too_narrow_which_is_why_none_is_claimed():
    # a slice of benchmarks/replay_percentiles.py --queued: one server at utilisation 0.8
    bench = load_benchmark("replay_percentiles")
    rows = bench.queued_coverage(reps=80, seed=2, utilisations=(0.8,), sizes=(100,), servers=(1,), pool=200)
    assert all(r["coverage"] < 0.8 for r in rows), rows


def test_intervals_on_requests_that_share_a_wave_are_too_narrow_and_alone_they_hold():
    # a slice of benchmarks/replay_percentiles.py --waves: waves of 8 cover p95 far below 0.95
    # (0.37-0.62 in the full run), one request a wave at the level
    bench = load_benchmark("replay_percentiles")
    rows = bench.wave_coverage(reps=100, seed=3, waves=(1, 8), sizes=(100,), quantiles=(0.95,), pool=200)
    alone, shared = rows
    assert alone["coverage"] >= 0.95 - 3 * (0.95 * 0.05 / 100) ** 0.5, alone
    assert shared["coverage"] < 0.8, shared


def test_engine_order_store_differs_from_end_of_request_eviction_only_when_full():
    # A: 4, B: 4, C: 4 tokens; capacity 8. Request 2 holds B and C: at the end of request 1 the
    # store has A, B; request 2 hits B, stores C (evicting A).
    reqs = [[("document", "A", 4), ("document", "B", 4)], [("document", "B", 4), ("document", "C", 4)],
            [("document", "A", 4), ("document", "B", 4)]]
    tr = trace_from_requests(reqs)
    in_order = simulate_segment_store(tr, 8)
    at_end, _ = simulate_segment(tr, 8)
    assert in_order.tolist() == [0, 4, 4] == at_end.tolist()
    big = trace_from_requests([[("document", "A", 6)], [("document", "B", 6)], [("document", "A", 6)]])
    assert simulate_segment_store(big, 10).tolist() == [0, 0, 0]  # B evicted A before it was back
    assert simulate_segment_store(big, 12).tolist() == [0, 0, 6]


def test_a_head_saved_after_the_load_changes_what_a_full_store_gives_up():
    # capacity 6; request 1: head H (2) and document A (4); request 2: H again and B (2).
    # Head stored before the load (a head request first): the store ends request 1 as H, A (A most
    # recent); B evicts H, then H evicts A: request 2 finds nothing. Head stored after the load
    # (vLLM in-process, saved at the end of the step that loads A): A, H; B evicts A and H is held.
    tr = trace_from_requests([[("prefix", "H", 2), ("document", "A", 4)], [("prefix", "H", 2), ("document", "B", 2)]])
    before = simulate_segment_store(tr, 6, stored_after=("prefix",), touch_on_load=True)
    after = simulate_segment_store(tr, 6, stored_after=("prefix",), touch_on_load=True, late_stored_after_load=True)
    assert before.tolist() == [0, 0] and after.tolist() == [0, 2]


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wl") / "w.jsonl"
    assert main(["generate", "workload", "--out", str(out), "--requests", "14", "--documents", "8",
                 "--queries", "5", "--docs-per-request", "2", "--doc-tokens", "uniform:30:70",
                 "--prefix-tokens", "12", "--question-tokens", "fixed:6", "--no-progress"]) == 0
    return out


def test_segment_replay_is_held_to_the_simulator_and_resumes_without_loss(workload, tmp_path, capsys):
    out = tmp_path / "seg"
    args = ["replay", "--workload", str(workload), "--cache-policy", "segment", "--cache-budget", "10MB",
            "--out", str(out), "--no-progress"]
    assert main(args + ["--limit", "6"]) == 0
    assert [r.index for r in ReplayDir(out).read_requests()] == list(range(6))
    assert main(args + ["--cache-budget", "20MB"]) == 2  # another budget is another replay
    assert "holds a replay with budget_bytes=10000000" in capsys.readouterr().err
    # the rest, in a second session that starts with an empty store; with an audit sample
    assert main(args + ["--audit-sample", "4"]) == 0
    out2 = out
    from kvaudit.core.dataset_format import read_dataset

    ds = read_dataset(out / "audit_dataset")
    assert [c.id for c in ds.cases] == ["r0000000", "r0000004", "r0000009", "r0000013"]
    assert all(c.metric == "agreement" and c.segment_ids for c in ds.cases)
    d = ReplayDir(out2)
    recs = d.read_requests()
    assert sorted(r.index for r in recs) == list(range(14))
    assert [r.session for r in recs] == [0] * 6 + [1] * 8
    s = d.read_summary()
    hr = s["hit_rate"]
    assert hr["measured"]["hit_tokens"] > 0  # the budget (217 tokens) holds a few documents
    assert s["evictions"] > 0  # and is small enough to evict
    assert hr["gap_points_engine_order"] == pytest.approx(0.0, abs=1e-9)
    assert abs(hr["gap_points"]) <= 10
    assert s["ttft_s"]["p50"]["low"] <= s["ttft_s"]["p50"]["value"] <= s["ttft_s"]["p50"]["high"]
    # where it was served: this machine's name and boot (leased machines share a name, not a boot)
    assert s["served"]["host"] == platform.node()
    assert s["served"]["boot"] == Path("/proc/sys/kernel/random/boot_id").read_text()[:8]
    # every warm-up is on the request path: a request that warmed documents up paid for it
    assert all(r.ttft_s >= r.warmup_s > 0 for r in recs if r.warmup_tokens > 0)


def test_a_killed_replay_resumes_without_losing_or_repeating_a_request(workload, tmp_path):
    """A `kvaudit replay` process killed (SIGKILL: no handler runs) while it serves, then resumed."""
    import subprocess
    import sys
    import time

    out = tmp_path / "rec"
    args = ["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB",
            "--out", str(out), "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "kvaudit.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    d = ReplayDir(out)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if d.requests_file.is_file() and d.requests_file.read_text().count("\n") >= 4:
            proc.kill()
            break
        time.sleep(0.05)
    proc.wait()
    served = len(d.finished())
    assert 4 <= served < 14, served  # killed mid-replay, not after it
    assert not d.summary_file.exists()
    assert main(args) == 0
    recs = d.read_requests()
    assert sorted(r.index for r in recs) == list(range(14))  # nothing lost, nothing twice
    assert {r.session for r in recs if r.index < served} == {0}
    assert {r.session for r in recs if r.index >= served} == {1}
    s = d.read_summary()
    assert s["sessions"] == 2 and s["hit_rate"]["measured"]["hit_tokens"] == 0


def test_prefix_policy_needs_the_in_process_vllm_engine(workload, tmp_path, capsys):
    code = main(["replay", "--workload", str(workload), "--cache-policy", "prefix", "--cache-budget", "1MB",
                 "--out", str(tmp_path / "p"), "--no-progress"])
    assert code == 2
    assert "--backend vllm" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_a_request_longer_than_the_model_is_refused_before_any_is_served(tmp_path, capsys):
    # The audit drops trailing documents to fit the model (one decision for every arm); a replay
    # must not: its numbers would describe shorter prompts than the workload's, under its name.
    wl = tmp_path / "long.jsonl"
    assert main(["generate", "workload", "--out", str(wl), "--requests", "3", "--documents", "6",
                 "--docs-per-request", "6", "--doc-tokens", "uniform:1500:1600", "--prefix-tokens", "12",
                 "--question-tokens", "fixed:6", "--no-progress"]) == 0
    capsys.readouterr()
    out = tmp_path / "r"
    assert main(["replay", "--workload", str(wl), "--cache-policy", "segment", "--cache-budget", "10MB",
                 "--out", str(out), "--no-progress", "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{wl}: 2 request(s) need more prompt tokens than the engine takes (8,191: the model's context" in err
    assert "r0000000 (" in err and "r0000001 (" in err and "never dropping documents" in err
    assert not (out / "requests.jsonl").exists()


@pytest.mark.parametrize("backend, flags, says", [
    ("vllm", ["--max-model-len", "4096"], "(4,095: --max-model-len 4096 less 1 answer token(s)): r7 (5,003 tokens). "
     "A replay serves each request whole, never dropping documents; raise --max-model-len"),
    ("vllm", [], "opened for the workload's longest request by its token counts"),
    ("openai", ["--base-url", "http://127.0.0.1:1"], "the server's context length less the answer tokens"),
])
def test_requests_that_do_not_fit_are_named_with_the_fix_for_the_backend(tmp_path, backend, flags, says):
    from kvaudit.cli import build_parser
    from kvaudit.replay.replay_cli import check_requests_fit

    argv = ["replay", "--workload", "w.jsonl", "--cache-policy", "recompute", "--cache-budget", "1MB",
            "--out", str(tmp_path), "--backend", backend, *flags]
    args = build_parser(argv).parse_args(argv)
    check_requests_fit(args, 4095, {"r6": 4095})  # fits exactly
    with pytest.raises(KvauditError) as e:
        check_requests_fit(args, 4095, {"r6": 4095, "r7": 5003})
    assert str(e.value).startswith("w.jsonl: 1 request(s) need more prompt tokens than the engine takes")
    assert says in str(e.value)


def test_a_bad_workload_is_named_by_line(tmp_path, capsys):
    bad = tmp_path / "w.jsonl"
    bad.write_text('{"id": "a", "pieces": [{"kind": "document", "id": "d", "tokens": 3}]}\n'
                   '{"id": "b", "pieces": [{"kind": "document", "id": "d", "tokens": "x"}]}\n')
    code = main(["replay", "--workload", str(bad), "--cache-policy", "segment", "--cache-budget", "1MB",
                 "--out", str(tmp_path / "r"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "tokens" in err and "Traceback" not in err


def test_percentile_interval_of_a_tiny_sample_is_open():
    from kvaudit.replay.summary import percentile_interval

    p = percentile_interval(np.array([0.1, 0.2, 0.3]), 0.99)
    assert p["value"] == 0.3 and p["high"] is None


def test_a_log_kept_with_its_text_is_replayed_with_that_text(tmp_path):
    from kvaudit.models import load_tokenizer

    log = tmp_path / "chat.jsonl"
    doc = "Doc: the refund policy is thirty days from delivery."
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": doc},
                          {"role": "user", "content": q}]} for q in ("How long?", "Refunds?", "Thirty?")]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    wl = tmp_path / "w.jsonl"
    assert main(["generate", "workload", "--from-log", str(log), "--keep-text", "--out", str(wl)]) == 0
    assert main(["replay", "--workload", str(wl), "--cache-policy", "segment", "--cache-budget", "50MB",
                 "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    recs = ReplayDir(tmp_path / "r").read_requests()
    tok = load_tokenizer("smollm2")
    doc_unit = len(tok(doc, add_special_tokens=False)["input_ids"]) + len(tok("\n\n", add_special_tokens=False)["input_ids"])
    assert [r.segment_tokens for r in recs] == [doc_unit] * 3  # the logged document, not synthetic text
    assert [r.segment_hit_tokens for r in recs] == [0, doc_unit, doc_unit]


def _synthetic_replay(path: Path, policy: str, ttft: float, seed: int, rate: float | None = None,
                      growth: float = 0.0, wave_size: int = 1, truncated: int = 0, n: int = 40,
                      preempted: list[int | None] | None = None, kv_space_bytes: int | None = None,
                      **engine: int) -> None:
    from kvaudit.replay.summary import summarise

    rng = np.random.default_rng(seed)
    d = ReplayDir(path)
    cfg = _config(policy=policy, workload_hash="same", n_requests=n, kv_space_bytes=kv_space_bytes,
                  **({"arrivals": f"poisson:{rate}:{seed}", "schedule": "arrivals"} if rate else {}))
    d.path.mkdir(parents=True)
    d.write_config(cfg)
    recs = []
    with d.appending() as app:
        for i in range(n):
            hit = 60 if policy == "segment" and i % 2 else 0
            arrival = i / rate if rate else None  # open loop: TTFT grows by `growth` s per s of arrivals
            rec = RequestRecord(index=i, request_id=f"r{i}", wave=i // wave_size, session=0, n_prompt_tokens=100 + i, head_tokens=10,
                                segment_tokens=80, ttft_s=float(ttft * rng.lognormal(0, 0.2) + growth * (arrival or 0)),
                                warmup_s=0.0, head_s=0.0, arrival_s=arrival,
                                queue_s=0.0, prefix_cache_tokens=0, segment_hit_tokens=hit, warmup_tokens=80 - hit,
                                tokens_computed=100 + i - hit, evictions=0.0, wall_s=ttft, ids_hash=f"h{i}",
                                piece_ids=["tmpl:x", f"seg:{i % 4}", f"tail:{i}"], piece_tokens=[10, 80, 10 + i],
                                piece_kinds=["prefix", "document", "question"], truncated=i < truncated,
                                preemptions=preempted[i] if preempted else None)
            app.append(rec)
            recs.append(rec)
    d.write_summary(summarise(recs, cfg, {"block_size": 16, "bytes_per_token": 1, "kv_tokens": 1000,
                                           "stores_heads": False, **engine}))


def test_requests_that_shared_a_wave_claim_no_interval_level(tmp_path):
    """Closed loop in waves of 4: a wave's requests share its batch, so their TTFTs move together
    and the independent-request intervals are too narrow (coverage of p95 0.37-0.62 in waves of 8:
    benchmarks/replay_percentiles.py --waves); one request a wave keeps the claim."""
    _synthetic_replay(tmp_path / "alone", "recompute", 0.2, 1)
    _synthetic_replay(tmp_path / "waves", "recompute", 0.2, 1, wave_size=4)
    assert main(["compare", str(tmp_path / "alone"), str(tmp_path / "waves"), "--out", str(tmp_path / "cmp")]) == 0
    got = json.loads((tmp_path / "cmp" / "replays.json").read_text())
    assert [r["summary"]["ttft_intervals_claimed"] for r in got["rows"]] == [True, False]
    page = (tmp_path / "cmp" / "replays.html").read_text()
    assert page.count("] †</span>") == 3 and "or shared a wave" in page


def test_a_replay_that_dropped_documents_says_so_on_its_page(tmp_path):
    # replays before 2026-12-05 served long requests with trailing documents dropped, silently
    _synthetic_replay(tmp_path / "old", "segment", 0.05, 0, truncated=3)
    _synthetic_replay(tmp_path / "new", "segment", 0.05, 1)
    assert main(["compare", str(tmp_path / "old"), str(tmp_path / "new"), "--out", str(tmp_path / "cmp")]) == 0
    page = (tmp_path / "cmp" / "replays.html").read_text()
    assert page.count("3 with documents dropped</span>") == 1 and page.count("with documents dropped</span>") == 1


def test_a_replay_that_vllm_preempted_says_so_in_its_summary_and_on_its_page(tmp_path, capsys):
    """A replay's engine is sized so that vLLM never preempts; where it did (a request, or a warm-up
    it started, lost its KV mid-batch), the summary counts the requests and times, the page marks
    the replay and `kvaudit replay`'s printout warns. Records without vLLM's request stats say nothing."""
    from kvaudit.replay.replay_cli import _print_summary

    counts = [0] * 40
    counts[3], counts[17] = 2, 1
    _synthetic_replay(tmp_path / "pre", "segment", 0.05, 0, preempted=counts)
    _synthetic_replay(tmp_path / "none", "segment", 0.05, 1, preempted=[0] * 40)
    _synthetic_replay(tmp_path / "unknown", "segment", 0.05, 2)
    got = {k: ReplayDir(tmp_path / k).read_summary()["preemptions"] for k in ("pre", "none", "unknown")}
    assert got == {"pre": {"requests": 2, "total": 3, "recorded": 40},
                   "none": {"requests": 0, "total": 0, "recorded": 40}, "unknown": None}
    assert main(["compare", *(str(tmp_path / k) for k in got), "--out", str(tmp_path / "cmp")]) == 0
    page = (tmp_path / "cmp" / "replays.html").read_text()
    assert page.count("preempted</span>") == 1 and "2 preempted</span>" in page
    _print_summary(ReplayDir(tmp_path / "pre").read_summary(), tmp_path / "pre")
    assert "vLLM preempted 2 of this replay's requests (3 times)" in capsys.readouterr().err
    _print_summary(ReplayDir(tmp_path / "none").read_summary(), tmp_path / "none")
    assert "preempted" not in capsys.readouterr().err


def test_a_kv_space_is_the_in_process_vllm_engines_and_part_of_what_a_replay_is(workload, tmp_path, capsys):
    """--kv-space sizes in-process vLLM's KV space (a server sizes its own: refused elsewhere, before
    any work); a replay at another KV space is another replay (resume refused), a config file that
    gives a bad one is named, and the page names the difference when replays at two spaces meet."""
    assert main(["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB",
                 "--kv-space", "6GB", "--out", str(tmp_path / "t"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--kv-space sizes the KV space of the in-process vLLM engine (--backend vllm); on --backend transformers" in err
    assert not (tmp_path / "t").exists()
    d = ReplayDir(tmp_path / "r")
    d.path.mkdir()
    d.write_config(_config(kv_space_bytes=6 * 10**9))
    d.check_resumable(_config(kv_space_bytes=6 * 10**9))
    with pytest.raises(KvauditError, match="holds a replay with kv_space_bytes=6000000000, not None"):
        d.check_resumable(_config())
    d.config_file.write_text(json.dumps({**json.loads(d.config_file.read_text()), "kv_space_bytes": -5}))
    with pytest.raises(DatasetError, match="field 'kv_space_bytes' must be a positive number of bytes or null, got -5"):
        d.read_config()
    _synthetic_replay(tmp_path / "own", "segment", 0.05, 0)
    _synthetic_replay(tmp_path / "team", "segment", 0.05, 1, kv_space_bytes=2 * 10**9)
    assert main(["compare", str(tmp_path / "own"), str(tmp_path / "team"), "--out", str(tmp_path / "cmp")]) == 0
    page = (tmp_path / "cmp" / "replays.html").read_text()
    assert "segment @ 0 MB, KV space 2,000 MB" in page
    assert ("KV space for requests in flight, bytes (--kv-space): enough that none waits for space in segment @ 0 MB; "
            "2,000,000,000 in segment @ 0 MB, KV space 2,000 MB") in page.replace("&#39;", "'")


def _engines_file(path: Path, candidate_options: str = "threads = 1", baseline_options: str = "threads = 2",
                  backend: str = "transformers") -> Path:
    path.write_text(f"""[baseline]\nbackend = "{backend}"\nmodel = "smollm2"\n[baseline.options]\n{baseline_options}\n
[candidate]\nbackend = "{backend}"\nmodel = "smollm2"\nchange = "one thread"\ndeclares = ["threads"]
[candidate.options]\n{candidate_options}\n""")
    return path


@pytest.mark.parametrize("extra, says", [
    (["--engine", "candidate"], "--engine names a table of an engines file: give it with --engines FILE"),
    (["--engines", "E"], "--engines {E}: give --engine baseline or --engine candidate, the table to replay on"),
    (["--engines", "E", "--engine", "candidate", "--model", "smollm2"],
     "--model and --engines: with --engines the engine's settings come from {E} (the table --engine names)"),
    (["--engines", "E", "--engine", "candidate", "--threads", "1"], "--threads and --engines"),
    (["--engines", "SEQS", "--engine", "candidate", "--concurrency", "2"],
     "--concurrency 2 and {SEQS}: [candidate] sets max_num_seqs = 4, the most requests its engine runs at once"),
    (["--engines", "KV", "--engine", "candidate", "--kv-space", "1GB"],
     "--kv-space and {KV}: [candidate.options] sets kv_cache_bytes, the engine's KV space; give one of them"),
    (["--engines", "TEXT", "--engine", "candidate"],
     "{TEXT}: [candidate.options] kv_cache_memory_bytes must be a positive whole number of bytes, got '1GB'"),
    (["--engines", "TEXT", "--engine", "baseline"],
     "{TEXT}: [baseline.options] sets both kv_cache_bytes and kv_cache_memory_bytes: one KV space"),
    (["--engines", "BARE", "--engine", "candidate", "--cache-policy", "segment"],
     "--cache-policy segment serves documents through kvaudit's KV connector, which {BARE} [candidate.options] "
     "segment_connector = false leaves out"),
])
def test_a_replay_on_an_engines_table_takes_its_settings_from_the_table_alone(workload, tmp_path, capsys, extra, says):
    files = {"E": _engines_file(tmp_path / "e.toml"),
             "SEQS": _engines_file(tmp_path / "seqs.toml", "max_num_seqs = 4", "max_num_seqs = 8", backend="vllm"),
             "KV": _engines_file(tmp_path / "kv.toml", "kv_cache_bytes = 1000000", "", backend="vllm"),
             "TEXT": _engines_file(tmp_path / "text.toml", 'kv_cache_memory_bytes = "1GB"',
                                   "kv_cache_bytes = 1\nkv_cache_memory_bytes = 1", backend="vllm"),
             "BARE": _engines_file(tmp_path / "bare.toml", "segment_connector = false", "", backend="vllm")}
    argv = ["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB",
            "--out", str(tmp_path / "r"), "--no-progress", *(str(files.get(x, x)) for x in extra)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says.format(**files) in err, err
    assert not (tmp_path / "r").exists()


def test_a_serving_change_replayed_on_each_engine_is_named_side_by_side(workload, tmp_path, capsys):
    """Replays of one workload on an engines file's baseline and candidate (a serving change under
    load): each records its table; the page labels them by engine and says they differ in the
    engine, and a resume on an edited table is refused."""
    engines = _engines_file(tmp_path / "e.toml")
    runs = {}
    for role in ("baseline", "candidate"):
        runs[role] = tmp_path / role
        assert main(["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB",
                     "--out", str(runs[role]), "--no-progress", "--limit", "3", "--engines", str(engines),
                     "--engine", role]) == 0
    assert main(["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB",
                 "--out", str(tmp_path / "plain"), "--no-progress", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "on the candidate engine (one thread)" in out and "on the baseline engine:" in out
    b, c = (ReplayDir(runs[r]).read_config() for r in ("baseline", "candidate"))
    assert (b.engine_role, b.engine_change, c.engine_role, c.engine_change) == ("baseline", None, "candidate",
                                                                                "one thread")
    assert b.engine_sha256 != c.engine_sha256 and b.model == c.model == "smollm2" and b.backend == "transformers"
    assert main(["compare", str(runs["baseline"]), str(runs["candidate"]), "--out", str(tmp_path / "cmp")]) == 0
    page = (tmp_path / "cmp" / "replays.html").read_text().replace("&#39;", "'")
    assert "recompute @ 1 MB · candidate (one thread)" in page
    # the change is the point of the comparison: said as such, not flagged as a difference to remove
    assert 'id="serving-change"' in page and "the candidate's change: <b>one thread</b>" in page
    assert 'id="differences"' not in page
    # beside a replay on the command line's engine, the engine is a difference
    assert main(["compare", str(runs["baseline"]), str(tmp_path / "plain"), "--out", str(tmp_path / "cmp2")]) == 0
    page = (tmp_path / "cmp2" / "replays.html").read_text().replace("&#39;", "'")
    assert ("the engine (an --engines table: a serving change): baseline in recompute @ 1 MB · baseline; "
            "the command line's in recompute @ 1 MB") in page and 'id="serving-change"' not in page
    _engines_file(engines, "threads = 1", baseline_options="threads = 3")
    assert main(["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB",
                 "--out", str(runs["baseline"]), "--no-progress", "--limit", "4", "--engines", str(engines),
                 "--engine", "baseline"]) == 2
    assert "holds a replay with engine_sha256=" in capsys.readouterr().err
    assert len(ReplayDir(runs["baseline"]).read_requests()) == 3


def test_an_fp8_kv_cache_is_sized_at_one_byte_an_element(workload):
    # a candidate with kv_cache_dtype fp8 holds four times the float32 tokens in the same bytes: the
    # least --kv-space and the KV space the replay gives it are counted so
    from kvaudit.cli import build_parser
    from kvaudit.replay.replay_cli import _Engine, engine_options
    from kvaudit.replay.workload_text import read_workload

    argv = ["replay", "--workload", str(workload), "--cache-policy", "prefix", "--cache-budget", "1MB", "--out", "x",
            "--backend", "vllm", "--concurrency", "2"]
    args = build_parser(argv).parse_args(argv)
    engine_options(args)  # the defaults filled in
    engine = _Engine(args, {}, read_workload(workload))
    full, fp8 = (engine._vllm_sizes(o)["kv_cache_bytes"] - 10**6 for o in ({}, {"kv_cache_dtype": "fp8"}))
    assert full == 4 * fp8 > 0
    args.kv_space = fp8 // 2  # holds one request at fp8, not at float32
    engine._vllm_sizes({"kv_cache_dtype": "fp8_e5m2"})
    with pytest.raises(KvauditError, match="Raise --kv-space to at least"):
        engine._vllm_sizes({})


def test_a_serving_changes_sweeps_are_read_against_its_baseline_engine():
    from kvaudit.reports.replay_report import _against

    def sweep(policy: str, role: str | None) -> dict:
        load = {"rate": 1.0, "p95": {"value": 0.5 if role == "candidate" else 1.0, "low": None, "high": None},
                "intervals_claimed": False, "past_saturation": False}
        return {"label": f"{policy} {role}", "policy": policy, "engine_role": role, "loads": [load]}

    got = _against([sweep("prefix", "candidate"), sweep("prefix", "baseline")])
    assert got["base"] == "prefix baseline" and got["rows"][0]["ratio"] == 0.5
    assert _against([sweep("segment", None), sweep("prefix", None)])["base"] == "prefix None"


def test_compare_names_what_replays_differ_in_beyond_the_policy(tmp_path):
    # Before 2026-12-05 a segment replay's vLLM engine opened at max_model_len 4,096 and prefix
    # caching's at the workload's longest request: their prefill chunks differed, under the policy's name.
    _synthetic_replay(tmp_path / "seg", "segment", 0.05, 0, max_prompt_tokens=4095)
    _synthetic_replay(tmp_path / "pre", "prefix", 0.2, 1, max_prompt_tokens=560, kv_tokens=5000)
    _synthetic_replay(tmp_path / "rec", "recompute", 0.2, 2, max_prompt_tokens=560)
    assert main(["compare", str(tmp_path / "pre"), str(tmp_path / "seg"), "--out", str(tmp_path / "c1")]) == 0
    page = (tmp_path / "c1" / "replays.html").read_text()
    assert 'id="differences"' in page
    assert "the engine&#39;s prompt limit" in page and "560 in prefix @ 0 MB; 4,095 in segment @ 0 MB" in page
    assert json.loads((tmp_path / "c1" / "replays.json").read_text())["differences"][0].startswith("the engine's")
    # the policy's own KV space (prefix: the budget on top) is not a difference
    assert main(["compare", str(tmp_path / "pre"), str(tmp_path / "rec"), "--out", str(tmp_path / "c2")]) == 0
    assert 'id="differences"' not in (tmp_path / "c2" / "replays.html").read_text()


def test_compare_puts_replays_side_by_side_and_refuses_a_mix(tmp_path, capsys):
    _synthetic_replay(tmp_path / "seg", "segment", 0.05, 0)
    _synthetic_replay(tmp_path / "rec", "recompute", 0.2, 1)
    assert main(["compare", str(tmp_path / "rec"), str(tmp_path / "seg"), "--out", str(tmp_path / "cmp")]) == 0
    page = (tmp_path / "cmp" / "replays.html").read_text()
    assert " †" not in page and "too narrow there" not in page  # closed loop: the intervals hold
    assert "segment @ 0 MB" in page and "recompute @ 0 MB" in page and "<script" not in page
    rows = json.loads((tmp_path / "cmp" / "replays.json").read_text())["rows"]
    assert [r["summary"]["config"]["policy"] for r in rows] == ["recompute", "segment"]
    assert rows[1]["summary"]["hit_rate"]["measured"]["hit_tokens"] == 20 * 60
    assert main(["report", str(tmp_path / "seg")]) == 0 and (tmp_path / "seg" / "replays.html").is_file()
    # one definition of the median on the page: the figure's label is the table's p50 (an order
    # statistic of the 40 requests, not the mean of the middle two), and its dots are requests
    from kvaudit.reports.plots import _secs

    for r in rows:
        p50 = r["summary"]["ttft_s"]["p50"]["value"]
        assert f"(n=40, median {_secs(p50)})" in page, (r["label"], _secs(p50))
    assert "dots: requests" in page and "dots: cases" not in page
    (tmp_path / "run").mkdir()
    assert main(["compare", str(tmp_path / "seg"), str(tmp_path / "run"), "--out", str(tmp_path / "c2")]) == 2
    assert "not a replay directory" in capsys.readouterr().err


def test_open_loop_waves_take_what_has_arrived_when_the_engine_is_free():
    from kvaudit.replay.serve import _waves

    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    arrivals = [0.0, 0.1, 0.2, 5.0, 5.0, 5.0]
    waves = []
    for pos, started in _waves(6, 2, arrivals, lambda: now[0], sleep):
        waves.append((pos, started))
        now[0] += 1.0  # each wave takes a second
    # request 0 alone at 0; 1 and 2 arrived while it ran; then idle until 5.0; 3 and 4, then 5
    assert waves == [([0], 0.0), ([1, 2], 1.0), ([3, 4], 5.0), ([5], 6.0)]
    closed = [pos for pos, _ in _waves(5, 2, None, lambda: 0.0, sleep)]
    assert closed == [[0, 1], [2, 3], [4]]


def test_an_open_loop_replay_counts_the_wait_in_ttft(workload, tmp_path):
    out = tmp_path / "open"
    assert main(["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB",
                 "--out", str(out), "--rate", "40", "--limit", "8", "--no-progress"]) == 0
    d = ReplayDir(out)
    recs = d.read_requests()
    assert d.read_config().arrivals == "poisson:40.0:0"
    assert all(r.arrival_s is not None and r.ttft_s >= r.queue_s for r in recs)
    assert max(r.queue_s for r in recs) > 0  # 40 a second on a CPU that serves a few: requests wait
    assert d.read_summary()["queue_s"]["p95"] > 0


def test_segment_policy_over_http_is_refused_before_any_request(workload, tmp_path, capsys):
    code = main(["replay", "--backend", "openai", "--base-url", "http://127.0.0.1:9", "--workload", str(workload),
                 "--cache-policy", "segment", "--cache-budget", "1MB", "--out", str(tmp_path / "h"), "--no-progress"])
    assert code == 2
    assert "needs kvaudit's own segment store" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()


def test_a_request_that_loads_after_a_later_admission_keeps_its_pieces_the_more_recent():
    """The engine reads a request's pieces from the store when it loads them (the step after its
    warm-ups), after any request admitted meanwhile pinned its own: the loaded pieces are then the
    more recently used, and a later eviction takes the other. A CPU replay in CI (16 requests, 347
    tokens of budget) once measured one document more than the simulation that marked pieces used
    only at admission: 2.3 points off."""
    from kvaudit.simulator.segment_cache import simulate_segment_store_at_arrivals

    t = trace_from_requests([[("document", d, n) for d, n in r] for r in (
        [("x", 3), ("y", 3)],  # r0 warms x and y
        [("x", 3), ("w", 1)],  # r1 pins x at 3, warms w, loads x and w at 5
        [("y", 3)],  # r2 pins y at 4 (after r1's admission, before r1's load)
        [("v", 2)],  # r3 stores v at 8: the store must evict one unpinned entry, x or y
        [("x", 3)],  # r4 finds x only where r1's load marked it used after y
    )])
    hits = simulate_segment_store_at_arrivals(t, 8, admitted=np.array([0.0, 3, 4, 7, 9]),
                                              ready=np.array([1.0, 5, 4, 8, 9]),
                                              released=np.array([2.0, 6, 4.5, 8.5, 10]))
    assert hits.tolist() == [0, 3, 3, 0, 3]


def test_a_load_runs_in_the_step_that_scheduled_it_after_admissions_since_its_submission():
    """A request submitted at 5 is loaded by the engine step that first schedules it (at 6); a
    request admitted between (at 5.5) asked the store for its piece first (marking it used) and,
    with no room for the piece before it, loads nothing, so the load's pieces are the more recent
    and a later eviction takes the other. Placing the load at the submission instead (what
    the simulation did until 2026-12-07) predicts the opposite: a CI replay at 2 req/s measured
    2.3 points less than it."""
    from kvaudit.simulator.segment_cache import simulate_segment_store_at_arrivals

    t = trace_from_requests([[("document", d, n) for d, n in r] for r in (
        [("x", 3), ("y", 3)],  # r0 warms x and y
        [("x", 3), ("w", 1)],  # r1 pins x at 3, warms w, is submitted at 5, loaded at 6
        [("z", 9), ("y", 3)],  # r2 marks y used at 5.5 (after r1's submission, before its load); z: no room
        [("v", 2)],  # r3 stores v at 8: the store must evict one unpinned entry, x or y
        [("x", 3)],  # r4 finds x only if r1's load marked it used after r2's pin of y
    )])
    times = dict(admitted=np.array([0.0, 3, 5.5, 7, 9]), ready=np.array([1.0, 5, 5.5, 8, 9]),
                 released=np.array([2.0, 6.6, 6.5, 8.5, 10]))
    counts: dict[str, int] = {}
    at_step = simulate_segment_store_at_arrivals(t, 8, **times, loaded=np.array([1.0, 6, 6, 8, 9]), counts=counts)
    assert at_step.tolist() == [0, 3, 0, 0, 3]
    assert counts == {"evictions": 1}  # y, for v
    at_submission = simulate_segment_store_at_arrivals(t, 8, **times)
    assert at_submission.tolist() == [0, 3, 0, 0, 0]


def test_a_warm_ups_store_runs_where_the_engine_ran_it_before_an_admission_the_frontend_saw_first():
    """vLLM's asynchronous scheduling (its default on CUDA) saves a warm-up's KV one engine step
    before the frontend sees the warm-up finish. r1's store of z (the worker's put at 4.9) evicts
    the oldest entry, x, before r2's admission at 5 asks for x: r2 warms x itself. Placed where the
    frontend saw it (5.1, after r2 pinned x), the store evicts y instead and r2 finds x: the
    engine-order gap of 0.1 to 1.2 points on the H100's replays (2026-12-07), which the
    store's own stamp (``piece_warmed_s``) closes."""
    from kvaudit.simulator.segment_cache import simulate_segment_store_at_arrivals

    t = trace_from_requests([[("document", d, n) for d, n in r] for r in (
        [("x", 3), ("y", 3)],  # r0 warms x then y: x the least recently used
        [("z", 4)],  # r1 warms z: storing it needs one entry evicted
        [("x", 3)],  # r2 asks for x at 5
    )])
    times = dict(admitted=np.array([0.0, 4, 5]), ready=np.array([1.0, 5.2, 5.3]),
                 released=np.array([2.0, 6, 7]), loaded=np.array([1.0, 5.2, 5.3]))
    for put, hits, evictions in ((4.9, [0, 0, 0], 2), (5.1, [0, 0, 3], 1)):
        counts: dict[str, int] = {}
        got = simulate_segment_store_at_arrivals(t, 8, **times, stored=[[1.0, 1.0], [put], [None]], counts=counts)
        assert got.tolist() == hits and counts == {"evictions": evictions}, put


def test_a_stamp_of_the_host_clock_lands_on_the_serving_clock_through_its_engine_step():
    from kvaudit.runners.engines.vllm.live import on_serving_clock, step_of

    step_mono, step_at = [100.0, 100.5, 101.0], [2.0, 2.5, 3.0]  # each step's start on both clocks
    assert step_of(99.0, step_mono) == -1 and on_serving_clock(99.0, step_mono, step_at) is None
    assert step_of(100.5, step_mono) == 1 and step_of(100.7, step_mono) == 1
    assert on_serving_clock(100.7, step_mono, step_at) == pytest.approx(2.7)
    assert on_serving_clock(102.0, step_mono, step_at) == pytest.approx(4.0)


def test_arrivals_need_arrival_times_and_an_engine_that_batches_as_requests_come(workload, tmp_path, capsys):
    assert main(["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB", "--out",
                 str(tmp_path / "a"), "--schedule", "arrivals", "--backend", "vllm"]) == 2
    assert "needs arrival times" in capsys.readouterr().err
    assert main(["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB", "--out",
                 str(tmp_path / "b"), "--schedule", "arrivals", "--rate", "2", "--backend", "transformers"]) == 2
    assert "needs an engine that batches requests as they come: --backend vllm" in capsys.readouterr().err


def test_the_store_at_arrivals_pins_waits_and_serves_what_it_cannot_hold_as_misses():
    from kvaudit.simulator.segment_cache import simulate_segment_store_at_arrivals

    def trace(*reqs):
        return trace_from_requests([[("prefix", "h", 10), *[("document", d, t) for d, t in r]] for r in reqs])

    t = trace([("a", 20), ("b", 20)], [("a", 20), ("b", 20)], [("b", 20), ("c", 20)])
    one_at_a_time = dict(admitted=np.array([0.0, 10, 20]), ready=np.array([1.0, 11, 21]),
                         released=np.array([2.0, 12, 22]))
    hits = simulate_segment_store_at_arrivals(t, 1000, **one_at_a_time)
    assert hits.tolist() == [0, 50, 30]  # the third finds h and b; c is its own warm-up
    # the second arrives while the first warms a and b: it waits for them, they are hits for it
    hits = simulate_segment_store_at_arrivals(t, 1000, admitted=np.array([0.0, 0.5, 20]),
                                              ready=np.array([1.0, 1.0, 21]), released=np.array([2.0, 2.0, 22]))
    assert hits.tolist() == [0, 50, 30]
    # 40 tokens of budget: the first's h and a fit, b would evict its own pinned entries: refused,
    # so it loads h and a only; the second (arriving after) finds h and a and warms b
    hits = simulate_segment_store_at_arrivals(t, 40, **one_at_a_time)
    assert hits.tolist() == [0, 30, 10]
    # the same tokens one at a time in the store's own order (no overlap, no pins needed) agree
    # where the budget holds every request
    from kvaudit.simulator.segment_cache import simulate_segment_store

    assert (simulate_segment_store(t, 1000, kinds=("prefix", "document")).tolist()
            == simulate_segment_store_at_arrivals(t, 1000, **one_at_a_time).tolist())


@pytest.mark.parametrize("rate, says", [("0", "positive number"), ("inf", "positive number"), ("x", "not a number"),
                                        ("1,2,1", "given twice")])
def test_a_bad_rate_is_refused_naming_it(workload, tmp_path, capsys, rate, says):
    assert main(["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB",
                 "--out", str(tmp_path / "r"), "--rate", rate]) == 2
    assert says in capsys.readouterr().err


def test_a_load_sweep_needs_the_in_process_vllm_engine(workload, tmp_path, capsys):
    assert main(["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB",
                 "--out", str(tmp_path / "r"), "--rate", "1,2", "--schedule", "waves"]) == 2
    assert "it needs --backend vllm, or --backend openai with --cache-policy recompute" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("extra, says", [
    ([], "--replications draws new Poisson arrivals for each replication: it needs --rate"),
    (["--rate", "2", "--schedule", "waves"], "(or --replications) serves every replay on one engine"),
    (["--replications", "0", "--rate", "2"], "argument --replications"),
])
def test_replications_need_a_rate_and_an_engine_whose_caches_empty(workload, tmp_path, capsys, extra, says):
    args = ["replay", "--workload", str(workload), "--cache-policy", "recompute", "--cache-budget", "1MB",
            "--out", str(tmp_path / "r"), "--replications", "3", *extra]
    assert main(args) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def _synthetic_sweep(path: Path, policy: str, p95_by_rate: dict[float, float],
                     growth: dict[float, float] | None = None, n: int = 40) -> None:
    rows = []
    for k, (rate, ttft) in enumerate(p95_by_rate.items()):
        _synthetic_replay(path / f"rate-{rate:g}", policy, ttft, k, rate=rate, growth=(growth or {}).get(rate, 0.0), n=n)
        rows.append({"rate": rate, "dir": f"rate-{rate:g}"})
    (path / "sweep.json").write_text(json.dumps({"policy": policy, "schedule": "arrivals", "loads": rows}))


def test_compare_draws_ttft_against_offered_load_and_the_load_an_slo_allows(tmp_path):
    # TTFT grows with load; the SLO (p95 within 0.5 s) holds up to 2/s for segment, 1/s for prefix
    _synthetic_sweep(tmp_path / "seg", "segment", {1.0: 0.1, 2.0: 0.3, 4.0: 2.0})
    _synthetic_sweep(tmp_path / "pre", "prefix", {1.0: 0.3, 2.0: 1.0, 4.0: 5.0})
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "pre"), str(tmp_path / "seg"), "--out", str(out), "--slo-ttft", "0.5"]) == 0
    got = json.loads((out / "replays.json").read_text())
    assert len(got["rows"]) == 6 and got["slo_ttft_s"] == 0.5
    within = {sw["label"].split(" ")[0]: sw["highest_within_slo"] for sw in got["sweeps"]}
    assert within == {"prefix": 1.0, "segment": 2.0}
    # read against prefix caching: p95 at each shared load, the ratio, and the load the SLO allows
    against = got["against"]
    assert against["base"] == "prefix @ 0 MB" and [r["rate"] for r in against["rows"]] == [1.0, 2.0, 4.0]
    p95 = {sw["label"].split(" ")[0]: [x["p95"]["value"] for x in sw["loads"]] for sw in got["sweeps"]}
    assert [r["ratio"] for r in against["rows"]] == [a / b for a, b in zip(p95["segment"], p95["prefix"])]
    assert all(r["apart"] is None for r in against["rows"])  # one replay a load: no level to compare
    # prefix caching met it at 1/s and missed at 2/s, segment reuse at 2/s and missed at 4/s: +100% at
    # the loads measured, and anything from +0% (2/s against just under 2/s) to +300% (just under 4/s
    # against 1/s) between them
    assert [sw["slo_missed_at"] for sw in got["sweeps"]] == [2.0, 4.0]
    assert against["base_sustained"] == 1.0 and against["sustained"] == [
        {"label": "segment @ 0 MB", "rate": 2.0, "gain": 1.0, "gain_low": 0.0, "gain_high": 3.0}]
    assert all([x["rate"] for x in sw["loads"]] == [1.0, 2.0, 4.0] for sw in got["sweeps"])
    page = (out / "replays.html").read_text()
    assert "Under load" in page and "TTFT against offered load" in page.replace("Time to first token against", "TTFT against")
    assert "Against prefix @ 0 MB" in page
    assert ("segment @ 0 MB 2.0/s (+100% load at the loads measured; the loads measured next, where the SLO "
            "was missed, put it between +0% and +300%)") in page
    # a sweep that met the SLO at every load measured bounds the gain on one side only
    assert main(["compare", str(tmp_path / "pre"), str(tmp_path / "seg"), "--out", str(tmp_path / "c4"),
                 "--slo-ttft", "3"]) == 0
    c4 = json.loads((tmp_path / "c4" / "replays.json").read_text())
    assert [sw["slo_missed_at"] for sw in c4["sweeps"]] == [4.0, None]
    assert c4["against"]["sustained"][0] == {"label": "segment @ 0 MB", "rate": 4.0, "gain": 1.0,
                                             "gain_low": 0.0, "gain_high": None}
    assert "more than +0%: segment @ 0 MB met the SLO at every load measured" in (
        tmp_path / "c4" / "replays.html").read_text()
    assert "segment @ 0 MB @ 4/s" in page and "<script" not in page
    assert "mathdefault" not in page  # log-axis labels as text ("500 ms"), not mathtext markup left raw
    # the SLO no load met is said, not left blank
    assert main(["compare", str(tmp_path / "pre"), "--out", str(tmp_path / "c2"), "--slo-ttft", "0.01"]) == 0
    assert "none of the loads measured" in (tmp_path / "c2" / "replays.html").read_text()
    # a sweep.json that names a folder outside it is refused naming the field
    (tmp_path / "seg" / "sweep.json").write_text(json.dumps({"loads": [{"rate": 1, "dir": "../pre"}]}))
    assert main(["compare", str(tmp_path / "seg"), "--out", str(tmp_path / "c3")]) == 2


def test_a_sustained_load_whose_p95_interval_reaches_past_the_slo_is_marked_at_the_edge(tmp_path):
    """The SLO reading uses the point p95; where the sustained load's interval reaches past the
    SLO (or has no upper end at so few requests), more requests or replications could move the
    reading, and the page says so beside it."""
    _synthetic_sweep(tmp_path / "pre", "prefix", {1.0: 0.3, 2.0: 1.0, 4.0: 5.0}, n=120)
    _synthetic_sweep(tmp_path / "few", "prefix", {1.0: 0.3, 2.0: 1.0}, n=40)

    def compare(sweep: str, slo: float, out: str) -> tuple[dict, str]:
        assert main(["compare", str(tmp_path / sweep), "--out", str(tmp_path / out), "--slo-ttft", str(slo)]) == 0
        return (json.loads((tmp_path / out / "replays.json").read_text())["sweeps"][0],
                (tmp_path / out / "replays.html").read_text())

    sw, page = compare("pre", 0.8, "wide")
    one = sw["loads"][0]["p95"]
    assert one["value"] < one["high"] < 0.8 and sw["highest_within_slo"] == 1.0
    assert sw["slo_edge"] is None and "at the edge" not in page  # the whole interval within the SLO
    slo = (one["value"] + one["high"]) / 2  # the point within, the interval's top past it
    sw, page = compare("pre", slo, "edge")
    assert sw["highest_within_slo"] == 1.0 and sw["slo_edge"] == {"high_s": one["high"], "claimed": False}
    assert f"at the edge: its p95 interval reaches {1000 * one['high']:.0f} ms (†: no level claimed)" in page
    assert "--replications 6" in page
    # 40 requests cannot bound a p95 from above (59 are needed at 95%): said, whatever the SLO
    sw, page = compare("few", 0.8, "few-out")
    assert sw["highest_within_slo"] == 1.0 and sw["loads"][0]["p95"]["high"] is None
    assert sw["slo_edge"] == {"high_s": None, "claimed": False}
    assert "too few requests for its p95 interval to have an upper end" in page


def test_a_load_past_saturation_never_counts_as_within_the_slo(tmp_path, capsys):
    # 4/s met the SLO only because the replay ended early: its TTFT grew 0.1 s per second of
    # arrivals (10 s of arrivals: +1 s at the end, under the p95 of 2 s the SLO allows) while 1 and 2/s
    # held level; and 8/s met it too, but a load past 4/s cannot count once 4/s did not
    _synthetic_sweep(tmp_path / "pre", "prefix", {1.0: 0.2, 2.0: 0.3, 4.0: 0.3, 8.0: 0.3}, growth={4.0: 0.1})
    assert main(["compare", str(tmp_path / "pre"), "--out", str(tmp_path / "cmp"), "--slo-ttft", "2"]) == 0
    got = json.loads((tmp_path / "cmp" / "replays.json").read_text())
    sw = got["sweeps"][0]
    assert [x["past_saturation"] for x in sw["loads"]] == [False, False, True, False]
    assert all(x["p95"]["value"] <= 2 for x in sw["loads"])  # every p95 met the SLO
    assert sw["highest_within_slo"] == 2.0 and sw["met_past_saturation"] == [4.0]
    page = (tmp_path / "cmp" / "replays.html").read_text()
    assert "past saturation</span>" in page and "4.0/s met it past saturation: not counted" in page
    # requests served at their arrivals queue: their percentile intervals claim no level
    assert not any(r["summary"]["ttft_intervals_claimed"] for r in got["rows"])
    assert "] †</span>" in page and "too narrow there" in page
    from kvaudit.stats.saturation import GROWTH_LIMIT, highest_sustained

    assert 0.1 > GROWTH_LIMIT and highest_sustained([{"rate": 1, "p95_s": 3.0}], 2.0) is None


def test_a_replicated_load_reads_as_the_median_replication_with_an_interval_that_holds(tmp_path):
    """--replications: each load's percentiles are the median over its replications, the interval
    their lowest to highest with 6 (distribution-free over independent replications), claimed
    though each replay's own intervals are not; a load with one replication past saturation is
    past saturation."""
    from kvaudit.reports.replay_report import build
    from kvaudit.stats.replications import median_interval

    def sweep(folder: str, policy: str, scale: float) -> list[dict]:
        rows = []
        for rate, ttft, saturated in ((1.0, 0.1, None), (2.0, 0.3, 4)):
            reps = []
            for seed in range(6):
                name = f"rate-{rate:g}-seed-{seed}"
                _synthetic_replay(tmp_path / folder / name, policy, scale * ttft * (1 + seed / 5), seed, rate=rate,
                                  growth=0.1 if seed == saturated else 0.0)
                reps.append({"seed": seed, "dir": name})
            rows.append({"rate": rate, "dir": reps[0]["dir"], "replications": reps})
        (tmp_path / folder / "sweep.json").write_text(json.dumps({"policy": policy, "loads": rows}))
        return rows

    rows = sweep("seg", "segment", 1.0)
    sweep("pre", "prefix", 5.0)  # five times slower: the intervals lie apart
    sweep("pre2", "prefix", 1.05)  # about the same: they overlap
    assert main(["compare", str(tmp_path / "seg"), str(tmp_path / "pre"), "--out", str(tmp_path / "cmp"),
                 "--slo-ttft", "5"]) == 0
    got = json.loads((tmp_path / "cmp" / "replays.json").read_text())
    # at 2/s one of segment's replications ran past saturation: its p95 reaches into prefix's interval
    assert [r["apart"] for r in got["against"]["rows"]] == ["lower", "overlapping"]
    assert [r["past_saturation"] for r in got["against"]["rows"]] == [False, True]
    assert main(["compare", str(tmp_path / "seg"), str(tmp_path / "pre2"), "--out", str(tmp_path / "cmp2")]) == 0
    got2 = json.loads((tmp_path / "cmp2" / "replays.json").read_text())
    assert [r["apart"] for r in got2["against"]["rows"]] == ["overlapping", "overlapping"]
    assert main(["compare", str(tmp_path / "seg"), "--out", str(tmp_path / "cmp"), "--slo-ttft", "5"]) == 0
    got = json.loads((tmp_path / "cmp" / "replays.json").read_text())
    assert len(got["rows"]) == 12 and got["against"] is None
    sw = got["sweeps"][0]
    assert sw["intervals_claimed"] and sw["replications"] == 6
    for x in sw["loads"]:
        p95s = sorted(r["summary"]["ttft_s"]["p95"]["value"] for r in got["rows"]
                      if r["summary"]["config"]["arrivals"].startswith(f"poisson:{x['rate']}:"))
        assert len(p95s) == 6 and x["replications"] == 6 and x["requests"] == 240
        assert x["p95"] == median_interval(p95s) and (x["p95"]["low"], x["p95"]["high"]) == (p95s[0], p95s[-1])
    assert [x["past_saturation"] for x in sw["loads"]] == [False, True] and sw["highest_within_slo"] == 1.0
    page = (tmp_path / "cmp" / "replays.html").read_text()
    assert "(6 replications)" in page and "median over the replications" in page
    # a replay listed twice would pass for two replications: refused
    twice = json.loads(json.dumps(rows))
    twice[0]["replications"].append(dict(twice[0]["replications"][0]))
    (tmp_path / "seg" / "sweep.json").write_text(json.dumps({"loads": twice}))
    with pytest.raises(KvauditError, match=r"sweep\.json: field 'loads\[0\]' names 'rate-1-seed-0' again"):
        build([tmp_path / "seg"])
    # a load whose replications were served at different rates is refused naming the replay
    rows[0]["replications"].append({"seed": 0, "dir": "../seg/rate-2-seed-0"})
    (tmp_path / "seg" / "sweep.json").write_text(json.dumps({"loads": rows}))
    assert main(["compare", str(tmp_path / "seg"), "--out", str(tmp_path / "c2")]) == 2
    rows[0]["replications"][-1]["dir"] = "rate-2-seed-0"
    rows[1]["replications"] = rows[1]["replications"][1:]  # listed once, under the wrong load
    (tmp_path / "seg" / "sweep.json").write_text(json.dumps({"loads": rows}))
    with pytest.raises(KvauditError, match=r"rate-2-seed-0/replay\.json: field 'config\.arrivals' must be"):
        build([tmp_path / "seg"])


@pytest.mark.parametrize("served, says", [
    ([None, None], "Not served side by side: some of these replays do not record where and when"),
    ([("a", "2026-12-04T10:00:00+00:00"), ("b", "2026-12-04T10:05:00+00:00")], "served on 2 machines (a, b)"),
    ([("vm", "2026-12-04T10:00:00+00:00", "1f0c"), ("vm", "2026-12-04T10:05:00+00:00", "77ab")],
     "served on 2 machines (vm boot 1f0c, vm boot 77ab)"),
    ([("vm", "2026-12-04T10:00:00+00:00", "1f0c"), ("vm", "2026-12-04T10:05:00+00:00", "1f0c")], None),
    ([("a", "2026-12-04T10:00:00+00:00"), ("a", "2026-12-04T12:00:00+00:00")], "finished 2.0 hours apart"),
    ([("a", "2026-12-04T10:00:00+00:00"), ("a", "2026-12-04T10:20:00+00:00")], None),
    ([("a", "2026-12-04T10:00:00"), ("a", "2026-12-04T10:20:00+00:00")], "finishing times in different forms"),
])
def test_compare_says_when_replays_were_not_served_side_by_side(tmp_path, served, says):
    """Issue 42: latencies measured on other machines or hours apart are put side by side only
    with a word on it; replays served back to back on one machine get none. Two leased machines
    share the host name ``vm``: their boots tell them apart."""
    for name, stamp in zip(("rec", "seg"), served, strict=True):
        _synthetic_replay(tmp_path / name, "segment" if name == "seg" else "recompute", 0.1, 0)
        if stamp is not None:
            d = ReplayDir(tmp_path / name)
            summary = d.read_summary()
            summary["served"] = {"host": stamp[0], "finished_utc": stamp[1], **({"boot": stamp[2]} if stamp[2:] else {})}
            d.write_summary(summary)
    assert main(["compare", str(tmp_path / "rec"), str(tmp_path / "seg"), "--out", str(tmp_path / "cmp")]) == 0
    page = (tmp_path / "cmp" / "replays.html").read_text()
    if says is None:
        assert 'id="apart"' not in page
    else:
        assert 'id="apart"' in page and says in page


def test_the_prefix_simulator_shares_the_head_blocks_the_engine_shares():
    """Issue 42: two heads that share their first 40 tokens (template and a shared timestamp start)
    share two 16-token blocks in vLLM's prefix cache; cut by blocks, the simulator shares them too
    (it saw each head as one unique piece, and predicted 0)."""
    from kvaudit.replay.serve import _pieces
    from kvaudit.replay.summary import simulated_hits
    from kvaudit.runners.prompt import Prompt

    def prompt(head_tail: int) -> Prompt:
        ids = list(range(40)) + [1000 + head_tail + k for k in range(10)] + list(range(500, 530)) + [7, 8]
        return Prompt(ids=ids, head_len=50, spans=[(50, 80)], segment_ids=["d"], segment_hashes=["dh"],
                      ids_hash=f"p{head_tail}")

    records = []
    for i, p in enumerate([prompt(0), prompt(100)]):
        ids, toks, kinds = _pieces(p, f"r{i}", template_len=12, head_block=16)
        assert toks == [16, 16, 16, 2, 30, 2] and kinds[:4] == ["prefix"] * 4
        records.append(RequestRecord(
            index=i, request_id=f"r{i}", wave=i, session=0, n_prompt_tokens=len(p.ids), head_tokens=50,
            segment_tokens=30, ttft_s=0.1, warmup_s=0.0, head_s=0.0, queue_s=0.0, prefix_cache_tokens=0,
            segment_hit_tokens=0, warmup_tokens=0, tokens_computed=len(p.ids), evictions=0.0, wall_s=0.1,
            ids_hash=p.ids_hash, piece_ids=ids, piece_tokens=toks, piece_kinds=kinds))
    assert records[0].piece_ids[:2] == records[1].piece_ids[:2] and records[0].piece_ids[2] != records[1].piece_ids[2]
    assert simulated_hits(records, "prefix", 10_000, 16, False).tolist() == [0, 32]
    # without blocks (the template alone as a shared piece) the shared second block is missed
    plain = [_pieces(prompt(0), "a", template_len=12), _pieces(prompt(100), "b", template_len=12)]
    assert plain[0][0][1] != plain[1][0][1]
