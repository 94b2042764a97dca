"""Cache simulator against hand-computed tiny traces, plus KV sizing, trace validation and the CLI."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import numpy as np
import pytest

from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.hit_rate import run_hit_rate, run_segment_hit_rate, token_hit_rate, windowed
from kvaudit.core.trace import read_trace, trace_from_requests
from kvaudit.simulator import simulate_cli
from kvaudit.simulator.engine import SimConfig, simulate
from kvaudit.simulator.kv_bytes import PRESETS, parse_capacity, resolve_model
from kvaudit.simulator.prefix_cache import simulate_prefix
from kvaudit.simulator.segment_cache import simulate_segment


def P(cid, t):
    return ("prefix", cid, t)


def D(cid, t):
    return ("document", cid, t)


def Q(cid, t):
    return ("question", cid, t)


def prefix_hits(reqs, capacity_tokens=10**9):
    return simulate_prefix(trace_from_requests(reqs), capacity_tokens).tolist()


def segment_hits(reqs, capacity_tokens=10**9, capture="neutral"):
    hits, warm = simulate_segment(trace_from_requests(reqs), capacity_tokens, capture)
    return hits.tolist(), warm.tolist()


# --------------------------------------------------------------------------- prefix cache


def test_prefix_one_changed_token_misses_from_its_block_on():
    # Tokens 0-19 system prompt, token 20 differs (X vs Y), then the same 40-token document.
    r1 = [P("sys", 20), P("X", 1), D("doc", 40), Q("q1", 3)]
    r2 = [P("sys", 20), P("Y", 1), D("doc", 40), Q("q2", 3)]
    # Only block 0 (tokens 0-15) precedes the change; block 1 (16-31) holds token 20, so it and
    # every later block miss, although 'sys' has 20 matching tokens and 'doc' all 40.
    assert prefix_hits([r1, r2]) == [0, 16]


def test_prefix_document_after_a_different_prefix_never_hits():
    assert prefix_hits([[P("a", 32), D("doc", 64), Q("q1", 8)],
                        [P("b", 32), D("doc", 64), Q("q2", 8)]]) == [0, 0]


def test_prefix_full_blocks_only_and_last_token_recomputed():
    # 20 tokens: one full block cached; a repeat hits that block only.
    assert prefix_hits([[P("a", 20)], [P("a", 20)]]) == [0, 16]
    # 32 tokens, repeated exactly: both blocks are cached, but the last token must be
    # recomputed, so only (32 - 1) // 16 = 1 block counts as hit.
    assert prefix_hits([[P("a", 32)], [P("a", 32)]]) == [0, 16]
    # Same 48 cached tokens followed by a new question: all three blocks hit.
    assert prefix_hits([[P("a", 48), Q("q1", 5)], [P("a", 48), Q("q2", 5)]]) == [0, 48]


def test_prefix_lru_eviction_order_over_blocks():
    # Budget 4 blocks; each request is one 2-block piece plus a 1-token question (no block).
    a, b, c = P("A", 32), P("B", 32), P("C", 32)
    reqs = [[a, Q("q1", 1)], [b, Q("q2", 1)], [a, Q("q3", 1)],  # A hit, now most recent
            [c, Q("q4", 1)],  # evicts B (least recent), keeps A
            [b, Q("q5", 1)],  # B missed; storing it evicts A
            [a, Q("q6", 1)],  # A missed; storing it evicts C
            [b, Q("q7", 1)]]  # B still there
    assert prefix_hits(reqs, capacity_tokens=4 * 16) == [0, 0, 32, 0, 0, 0, 32]


def test_prefix_evicts_tail_blocks_first():
    # Budget 3 blocks. A fills them; B's one block evicts A's *last* block only.
    reqs = [[P("A", 48), Q("q1", 1)], [P("B", 16), Q("q2", 1)], [P("A", 48), Q("q3", 1)]]
    assert prefix_hits(reqs, capacity_tokens=3 * 16) == [0, 0, 32]
    # Within one request too large for the budget, the head survives and the tail goes.
    reqs = [[P("A", 32), D("B", 32), Q("q1", 1)], [P("A", 32), D("C", 16), Q("q2", 1)]]
    assert prefix_hits(reqs, capacity_tokens=2 * 16) == [0, 32]


# --------------------------------------------------------------------------- segment cache


def test_segment_hits_regardless_of_position_and_prefix():
    r1 = [P("meta1", 30), D("d1", 100), D("d2", 50), Q("q1", 10)]
    r2 = [P("meta2", 7), D("d2", 50), D("d3", 20), D("d1", 100), Q("q2", 10)]
    hits, warm = segment_hits([r1, r2])
    assert hits == [0, 150]
    assert warm == [150, 20]  # neutral warm-up computes each missed document once
    # Prefix caching gets nothing from the same pair: the prefixes differ.
    assert prefix_hits([r1, r2]) == [0, 0]


def test_segment_capture_modes_move_compute_not_hits():
    reqs = [[P("m1", 5), D("d1", 40), Q("q1", 5)], [P("m2", 5), D("d1", 40), D("d2", 9), Q("q2", 5)]]
    neutral = segment_hits(reqs, capture="neutral")
    first_user = segment_hits(reqs, capture="first-user")
    assert neutral[0] == first_user[0] == [0, 40]
    assert neutral[1] == [40, 9] and first_user[1] == [0, 0]


def test_segment_lru_eviction_order_at_byte_budget():
    shape = PRESETS["smollm2-135m"]
    assert shape.bytes_per_token == 23040
    budget_bytes = 100 * shape.bytes_per_token  # room for 100 tokens: two 40-token documents
    docs = {k: D(k, 40) for k in "ABC"}
    order = "A B A C B A B".split()
    reqs = [[P(f"m{i}", 4), docs[k], Q(f"q{i}", 4)] for i, k in enumerate(order)]
    # A, B stored; A hit (now most recent); C evicts B; B missed, evicts A; A missed, evicts C;
    # B hit.
    expected = [0, 0, 40, 0, 0, 0, 40]
    sim = simulate(trace_from_requests(reqs), SimConfig(capacities=[budget_bytes], model=shape,
                                                        policies=("segment",), windows=7))
    (res,) = sim["results"]
    assert res["capacity_tokens"] == 100
    assert [round(w["token_hit_rate"] * 48) for w in res["windows"]] == expected
    assert segment_hits(reqs, capacity_tokens=100)[0] == expected


def test_segment_larger_than_budget_is_never_stored():
    reqs = [[D("big", 500), Q("q1", 1)], [D("big", 500), Q("q2", 1)]]
    assert segment_hits(reqs, capacity_tokens=100) == ([0, 0], [0, 0])


# --------------------------------------------------------------------------- hit rate, engine


def test_token_hit_rate_is_token_weighted():
    hr = token_hit_rate([0, 50], [100, 50])
    assert hr.rate == pytest.approx(1 / 3)  # a mean of per-request ratios would say 0.5
    assert token_hit_rate([], []).rate is None
    with pytest.raises(ValueError):
        token_hit_rate([60], [50])
    wins = windowed(np.array([0, 10, 20, 30]), np.array([10, 10, 40, 40]), 2)
    assert [w["token_hit_rate"] for w in wins] == [0.5, 0.625]


def test_run_hit_rate_reads_runner_records():
    def pair(n, reused):
        return SimpleNamespace(n_prompt_tokens=n, segment_spans=[(5, 5 + max(reused, 10))],
                               arms={"reuse": SimpleNamespace(tokens_reused=reused, cache_hit_tokens=reused // 2),
                                     "recompute": SimpleNamespace(tokens_reused=0, cache_hit_tokens=0)})

    pairs = [pair(100, 80), pair(300, 0)]
    assert run_hit_rate(pairs, "reuse").rate == pytest.approx(0.1)  # tokens already cached / prompt
    assert run_hit_rate(pairs, "recompute").rate == 0.0
    assert run_segment_hit_rate(pairs, "reuse").rate == pytest.approx(80 / 90)  # loaded / segment tokens


def test_engine_cold_and_warm_partition_the_total():
    reqs = [[P(f"m{i}", 8), D(f"d{i % 3}", 64), Q(f"q{i}", 8)] for i in range(10)]
    sim = simulate(trace_from_requests(reqs), SimConfig(capacities=[10**12], model=PRESETS["llama-3.1-8b"],
                                                        cold_fraction=0.3, windows=5))
    assert {(r["policy"], r["capacity"]) for r in sim["results"]} == {("segment", "1TB"), ("prefix", "1TB")}
    seg = next(r for r in sim["results"] if r["policy"] == "segment")
    assert seg["cold"]["request_range"] == [0, 3] and seg["warm"]["request_range"] == [3, 10]
    assert seg["cold"]["requests"] == 3
    assert seg["cold"]["hit_tokens"] + seg["warm"]["hit_tokens"] == seg["hit_tokens"] == 7 * 64
    assert seg["prefill_tokens"] == seg["prompt_tokens"] - seg["hit_tokens"] + seg["warmup_tokens"]
    assert len(seg["windows"]) == 5


# --------------------------------------------------------------------------- KV bytes


def test_kv_bytes_presets_and_config(tmp_path):
    assert resolve_model("GPT-OSS-120B").bytes_per_token == 2 * 36 * 8 * 64 * 2
    assert resolve_model("llama-3.1-8b").bytes_per_token == 131072
    assert resolve_model("llama-3.1-8b", "fp8").bytes_per_token == 65536
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512,
           "num_key_value_heads": 2, "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert resolve_model(str(tmp_path)).bytes_per_token == 2 * 4 * 2 * 64 * 4
    mla = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256, "kv_lora_rank": 512,
           "qk_rope_head_dim": 64}
    (tmp_path / "mla.json").write_text(json.dumps(mla))
    assert resolve_model(str(tmp_path / "mla.json")).bytes_per_token == 2 * 576 * 2
    (tmp_path / "bad.json").write_text(json.dumps({"num_attention_heads": 4}))
    with pytest.raises(KvauditError, match="bad.json: missing field 'num_hidden_layers'"):
        resolve_model(str(tmp_path / "bad.json"))
    with pytest.raises(KvauditError, match="neither a preset"):
        resolve_model("no-such-model")


def test_parse_capacity():
    assert parse_capacity("30GB") == 30 * 10**9
    assert parse_capacity("1TB") == 10**12
    assert parse_capacity("1.5GiB") == int(1.5 * 2**30)
    for bad in ("30 parsecs", "GB", "-1GB", "0GB"):
        with pytest.raises(KvauditError):
            parse_capacity(bad)


# --------------------------------------------------------------------------- trace files


GOOD = {"id": "r1", "timestamp": 0.5,
        "pieces": [{"kind": "prefix", "id": "p", "tokens": 10}, {"kind": "document", "id": "d", "tokens": 20},
                   {"kind": "question", "id": "q", "tokens": 3}]}


def _write(tmp_path, rows):
    path = tmp_path / "log.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_read_trace_user_log(tmp_path):
    second = {"id": "r2", "pieces": [{"kind": "document", "id": "d", "tokens": 20, "score": 0.9}],
              "user": "x"}  # no timestamp, extra fields: fine
    tr = read_trace(_write(tmp_path, [GOOD, "", second]))
    assert tr.n_requests == 2 and tr.request_ids == ["r1", "r2"]
    assert tr.request_tokens().tolist() == [33, 20]
    assert tr.content[1] == tr.content[3]  # same content id, same code
    assert np.isnan(tr.timestamps[1])


@pytest.mark.parametrize("bad, message", [
    ({"id": "r2", "pieces": []}, "line 2: field 'pieces' must be a non-empty list"),
    ({"id": "r2", "pieces": [{"kind": "doc", "id": "d", "tokens": 20}]}, "line 2: field 'pieces[0].kind'"),
    ({"id": "r2", "pieces": [{"kind": "document", "id": "d", "tokens": 2.5}]},
     "line 2: field 'pieces[0].tokens' must be a positive integer"),
    ({"id": "r2", "pieces": [{"kind": "document", "id": "d", "tokens": 21}]},
     "line 2: field 'pieces[0].tokens': content id 'd' has 21 tokens here but 20 on line 1"),
    ({"id": "r1", "pieces": [{"kind": "document", "id": "d", "tokens": 20}]}, "line 2: field 'id': duplicate"),
    ({"pieces": [{"kind": "document", "id": "d", "tokens": 20}]}, "line 2: field 'id'"),
    ({"id": "r2", "timestamp": "noon", "pieces": [{"kind": "document", "id": "d", "tokens": 20}]},
     "line 2: field 'timestamp'"),
    ('{"id": "r2", ', "line 2: not valid JSON"),
])
def test_read_trace_errors_name_file_line_field(tmp_path, bad, message):
    path = _write(tmp_path, [GOOD, bad])
    with pytest.raises(DatasetError) as e:
        read_trace(path)
    assert str(path) in str(e.value) and message in str(e.value)


def test_read_trace_missing_or_empty(tmp_path):
    with pytest.raises(DatasetError, match="file not found"):
        read_trace(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="no requests"):
        read_trace(tmp_path / "empty.jsonl")


# --------------------------------------------------------------------------- CLI


def _cli(argv):
    parser = argparse.ArgumentParser()
    simulate_cli.add_arguments(parser)
    return simulate_cli.run(parser.parse_args(argv))


def test_simulate_cli_writes_json_table_and_plots(tmp_path, capsys):
    rows = [{"id": f"r{i}", "timestamp": i,
             "pieces": [{"kind": "prefix", "id": "date" if i % 2 else f"meta{i}", "tokens": 40},
                        {"kind": "document", "id": f"d{i % 3}", "tokens": 300},
                        {"kind": "question", "id": f"q{i}", "tokens": 12}]} for i in range(30)]
    log = _write(tmp_path, rows)
    out = tmp_path / "sim"
    assert _cli(["--workload", str(log), "--model-config", "smollm2-135m", "--cache-budget", "10MB,1GB",
                 "--out", str(out), "--windows", "3"]) == 0
    sim = json.loads((out / "simulation.json").read_text())
    assert [(r["policy"], r["capacity"]) for r in sim["results"]] == [
        ("segment", "10MB"), ("segment", "1GB"), ("prefix", "10MB"), ("prefix", "1GB")]
    big = {r["policy"]: r for r in sim["results"] if r["capacity"] == "1GB"}
    assert big["segment"]["hit_tokens"] == 27 * 300  # every document after its first sight
    assert big["segment"]["token_hit_rate"] > big["prefix"]["token_hit_rate"] > 0
    assert "| 1GB |" in (out / "simulation.md").read_text()
    for svg in ("hit_rate_vs_capacity.svg", "hit_rate_over_time.svg"):
        assert "<svg" in (out / svg).read_text()[:500]
    assert "segment all" in capsys.readouterr().out


def test_simulate_cli_bad_options(tmp_path, capsys):
    log = _write(tmp_path, [GOOD])
    with pytest.raises(KvauditError, match="--policies"):
        _cli(["--workload", str(log), "--out", str(tmp_path / "o"), "--policies", "segment,lmcache"])
    with pytest.raises(SystemExit) as e:  # argparse's error, naming --cache-budget (kvaudit exits 2)
        _cli(["--workload", str(log), "--out", str(tmp_path / "o"), "--cache-budget", "30 GBs"])
    assert e.value.code == 2
    assert "argument --cache-budget/--capacity: '30 GBs' is not a size" in capsys.readouterr().err


@pytest.mark.parametrize("queries", [5, 0])
def test_prefix_merging_never_repeated_tails_is_exact(queries):
    from kvaudit.generators.workload import WorkloadParams, generate

    tr = generate(WorkloadParams(requests=1500, documents=200, queries=queries, docs_per_request=3,
                                 doc_tokens="lognormal:100:1", prefix_tokens=20, shared_prefix_share=0.5))
    for cap in (500, 5000, 50_000, 10**9):
        fast = simulate_prefix(tr, cap)
        assert np.array_equal(fast, simulate_prefix(tr, cap, merge_unique_tails=False))
    assert fast.sum() > 0
