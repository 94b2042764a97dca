"""Fuzzing every reader of user-supplied files: the fast slice of the harness in
:mod:`kvaudit.testing.fuzz_readers` (a few dozen examples per reader, derandomized), and the inputs
fuzzing found, pinned."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given

from kvaudit.core.errors import USER_ERRORS
from kvaudit.testing.fuzz_readers import (
    _PROSE,
    BIG_INT,
    DEEP_ARRAY,
    EXAMPLES,
    FUZZ,
    HUGE_INT,
    MEDIUM_ARRAY,
    READERS,
    _jsonl,
    _read_replay,
    _replay_files,
    attempt,
    check_message,
    inputs,
    seed_files,
)


def with_examples(test: Callable) -> Callable:
    for recipe in reversed(EXAMPLES):
        test = example(recipe=recipe)(test)
    return test


@pytest.mark.parametrize("name", list(READERS))
@FUZZ
@given(recipe=inputs())
@with_examples
def test_any_input_reads_or_is_a_user_error_naming_the_file(name, recipe):
    attempt(name, recipe)


# --------------------------------------------------------------------------- what the fuzzer found
# Each: the reader, an input, and a fragment of the user error it now gives (before the fix, the
# exception named in the comment escaped instead).

def _req(rid: str = "r1", tokens: str = "3", extra: str = "") -> str:
    """One workload line (with its newline)."""
    return '{"id": "' + rid + '", "pieces": [{"kind": "document", "id": "d1", "tokens": ' + tokens + "}]" + extra + "}\n"


@pytest.mark.parametrize("name, data, message", [
    # trace: OverflowError (numpy int64) / OverflowError (float) / a segfault in pyarrow
    ("workload", _req(tokens="1" + "0" * 30), "must be a positive integer of at most"),
    ("workload", _req(extra=', "timestamp": 1' + "0" * 400), "field 'timestamp' must be a finite number"),
    ("workload", _req(extra=', "timestamp": -Infinity'), "field 'timestamp' must be a finite number"),
    ("workload", "null\n" + _req(), "line 1: expected a JSON object"),
    ("workload", _req() + "null\n", "line 2: expected a JSON object"),
    # kv_bytes config.json: ValueError / RecursionError from json.loads, TypeError, ValueError
    ("kv_config", '{"num_hidden_layers": ' + HUGE_INT + "}", "unreadable JSON value"),
    ("kv_config", '{"num_hidden_layers": ' + DEEP_ARRAY + "}", "nested too deeply"),
    ("kv_config", '{"num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 8, "torch_dtype": ["x"]}',
     "field 'torch_dtype': unknown dtype ['x']"),
    ("kv_config", '{"num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 8, "kv_lora_rank": 4, '
                  '"qk_rope_head_dim": "x"}', "field 'qk_rope_head_dim' must be an integer of at least 0"),
    ("kv_config", '{"num_hidden_layers": ' + BIG_INT + ', "num_attention_heads": 2}',
     "field 'num_hidden_layers' must be a positive integer (at most 1000000), got an integer of 4000 digits"),
    # importers: ValueError / RecursionError from json.loads; UnicodeEncodeError writing the dataset
    ("import_ctxs", '[{"question": ' + HUGE_INT + "}]", "unreadable JSON value"),
    ("import_ctxs_jsonl", '{"question": ' + DEEP_ARRAY + "}\n", "line 1: JSON nested too deeply"),
    ("import_longbench", '{"input": "q\\ud800", "context": "c", "answers": ["a"]}\n',
     "line 1: field 'input' is not Unicode text"),
    # manifest, audit: UnicodeEncodeError / RecursionError writing the record back on resume
    ("manifest", '{"status": "a\\ud800"}', "field 'status' is not Unicode text"),
    ("manifest", '{"custom": ' + MEDIUM_ARRAY + "}", "field 'custom" ),
    ("audit", '{"format": 2, "x": {"\\udc00": 1}}', "is not Unicode text"),
])
def test_found_failures_are_user_errors_naming_the_file(name, data, message):
    reader = READERS[name]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for rel, raw in {**seed_files(name), reader.target: data.encode()}.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(raw)
        with pytest.raises(USER_ERRORS) as e:
            reader.read(d)
        text = str(e.value)
        check_message(text, d / reader.target)
        assert message in text, text[:300]


def test_a_null_row_never_reaches_pyarrow(tmp_path):
    """pyarrow 26 segfaults on a JSONL block starting with ``null``: in a child process, so a
    regression fails this test instead of killing the suite."""
    import subprocess
    import sys

    path = tmp_path / "w.jsonl"
    path.write_text("null\n" + _req())
    code = ("import sys; from kvaudit.core.trace import read_trace\n"
            "try:\n    read_trace(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "line 1: expected a JSON object" in r.stdout, (r.returncode, r.stderr[-500:])


@pytest.mark.parametrize("text", [
    _req("a").strip() + " " + _req("b"),
    _req("a").strip() + "\r" + _req("b"),
    "\ufeff" + _req(),
    _req(""),  # an empty request id
    _req("a") + "\n" + _req("b", tokens="4"),
])
def test_the_fast_workload_reader_reads_only_what_the_careful_one_reads(tmp_path, text):
    """Two requests on one line, lines split by a lone CR, a byte order mark, a blank line:
    pyarrow read these where the line-by-line reader (the reference) does not, or not alike."""
    from kvaudit.core import trace as tr

    path = tmp_path / "w.jsonl"
    path.write_text(text, encoding="utf-8")
    try:
        careful = tr._read_careful(path)
    except USER_ERRORS:
        careful = None
    fast = tr._read_fast(path)
    assert fast is None or (careful is not None and careful.request_ids == fast.request_ids)
    if careful is None:
        with pytest.raises(USER_ERRORS):
            tr.read_trace(path)


@pytest.mark.parametrize("line, reason", [
    ('{"text": ' + HUGE_INT + "}", "line 2: unreadable JSON value"),
    ('{"text": ' + DEEP_ARRAY + "}", "line 2: JSON nested too deeply to read"),
    ('{"text": "a\\ud800"}', "line 2: field 'text' is not Unicode text"),
])
def test_the_corpus_generator_skips_and_names_a_bad_jsonl_line(tmp_path, line, reason):
    """The corpus generator's promise: a file with a line it cannot read is skipped and named with
    the line, the rest of the corpus used (before: ValueError, RecursionError, and a
    UnicodeEncodeError writing the dataset)."""
    from kvaudit.core.dataset_format import read_dataset, write_dataset
    from kvaudit.generators import corpus
    from kvaudit.generators.knobs import ReuseKnobs

    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(4):
        (src / f"doc{i}.txt").write_text("\n\n".join(f"{_PROSE} Part {i}.{k} of the record."
                                                     for k in range(3)))
    (src / "rows.jsonl").write_text(json.dumps({"text": _PROSE}) + "\n" + line + "\n")
    segments, cases, params, counts = corpus.generate(src, knobs=ReuseKnobs(cases=6))
    (skip,) = counts["skipped_files"]
    assert skip["file"] == str(src / "rows.jsonl") and skip["kind"] == "unreadable"
    assert skip["reason"].startswith(reason), skip["reason"][:200]
    from kvaudit.core.dataset_format import DatasetCard

    write_dataset(tmp_path / "out", segments.values(), cases, DatasetCard("corpus", counts=counts))
    assert len(read_dataset(tmp_path / "out").cases) == 6


def _edited_run(tmp_path: Path, edit: Callable[[dict], None]) -> Path:
    """A synthetic run whose first pair record went through ``edit``."""
    from kvaudit.testing.synthetic import make_run

    run = make_run(tmp_path / "run", n_per_task=1, leak_probes=0)
    lines = (run / "pairs.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    edit(first)
    (run / "pairs.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    return run


@pytest.mark.parametrize("edit, message", [
    # found by benchmarks/fuzz_readers.py --examples 3000 --seed 1: an arm name's control
    # characters echoed raw; null decode_s / cache_hit_tokens read as if valid
    (lambda p: p["arms"].__setitem__("p\x18q", [1]), "field 'arms.p\\x18q' must be an object, got list"),
    (lambda p: p["arms"]["reuse"].__setitem__("decode_s", None), "field 'decode_s' must be a number, got null"),
    (lambda p: p["arms"]["reuse"].__setitem__("cache_hit_tokens", None),
     "field 'cache_hit_tokens' must be int, got null"),
])
def test_fuzz_found_pair_records(tmp_path, edit, message):
    from kvaudit.core.run_dir import RunDir

    run = _edited_run(tmp_path, edit)
    with pytest.raises(USER_ERRORS) as e:
        RunDir(run).read_pairs()
    check_message(str(e.value), run / "pairs.jsonl")
    assert message in str(e.value), str(e.value)[:300]


def test_fuzz_found_a_long_audit_verdict_is_echoed_cut(tmp_path):
    from kvaudit.core.run_dir import RunDir
    from kvaudit.testing.synthetic import make_run

    run = RunDir(make_run(tmp_path / "run", n_per_task=1, leak_probes=0))
    audit = json.loads(run.audit_file.read_text())
    for field in ("verdict", "format"):
        run.audit_file.write_text(json.dumps({**audit, field: "x" * 100000}))
        with pytest.raises(USER_ERRORS) as e:
            run.read_audit()
        check_message(str(e.value), run.audit_file)
        assert f"field '{field}'" in str(e.value)


def test_fuzz_found_a_huge_integer_in_a_policy_is_not_echoed(tmp_path):
    from kvaudit.reports.policy import load_policy

    path = tmp_path / "policy.toml"
    path.write_text("confidence = " + "9" * 4000 + '\n[[delta]]\ngroup = "overall"\nmin_lower_bound = -5\n')
    with pytest.raises(USER_ERRORS) as e:
        load_policy(path)
    check_message(str(e.value), path)
    assert "must be a finite number, not an integer too large for a float" in str(e.value)


# Found by benchmarks/fuzz_readers.py on requests.jsonl: records whose piece lists disagree, or
# whose hits exceed the prompt, reached the summary and raised ValueError on resume.
@pytest.mark.parametrize("edit, field", [
    ({"piece_kinds": ["prefix", "document"]}, "piece_ids"),
    ({"piece_kinds": ["prefix", "doc", "question"]}, "piece_kinds[1]"),
    ({"piece_tokens": [20, 0, 20]}, "piece_tokens[1]"),
    ({"segment_hit_tokens": 500}, "segment_hit_tokens"),
    ({"warmup_tokens": -1}, "warmup_tokens"),
])
def test_a_request_record_the_summary_cannot_use_is_refused_naming_the_field(tmp_path, edit, field):
    from kvaudit.core.errors import DatasetError

    files = _replay_files()
    rows = [json.loads(line) for line in files["requests.jsonl"].decode().splitlines()]
    rows[1].update(edit)
    files["requests.jsonl"] = _jsonl(rows)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(DatasetError, match=r"requests\.jsonl, line 2") as e:
        _read_replay(tmp_path)
    assert f"'{field}'" in str(e.value)


# The replay page's reader (replay.json, which kvaudit writes and a reviewer may edit or cut): before
# it was typed, each of these gave a traceback (AttributeError, TypeError, KeyError, ValueError).
@pytest.mark.parametrize("edit, message", [
    (lambda s: s.__setitem__("ttft_growth", 5), "field 'ttft_growth' must be an object, got int"),
    (lambda s: s["ttft_s"]["p95"].__setitem__("value", float("nan")), "field 'ttft_s.p95.value' must be a finite"),
    (lambda s: s.pop("ttft_s"), "missing field 'ttft_s'"),
    (lambda s: s["hit_rate"]["over_time"][1].__setitem__("token_hit_rate", 1.5),
     "field 'hit_rate.over_time[1].token_hit_rate' must be a rate from 0 to 1"),
    (lambda s: s["throughput"].__setitem__("requests_per_s", -2), "field 'throughput.requests_per_s' must not be"),
    (lambda s: s["client_overhead_s"].__setitem__("after_engine", [1]), "field 'client_overhead_s.after_engine'"),
    (lambda s: s["config"].__setitem__("arrivals", "poisson:fast:0"), "field 'config.arrivals' must be closed"),
    (lambda s: s["config"].__setitem__("arrivals", "closed"), "field 'config.arrivals' must be poisson:RATE:SEED"),
    (lambda s: s["config"].pop("policy"), "missing field 'config.policy'"),
])
def test_a_replay_summary_the_page_cannot_use_is_refused_naming_the_field(tmp_path, edit, message):
    from kvaudit.reports.replay_report import build

    files = seed_files("replay_summary")
    summary = json.loads(files["rate-2/replay.json"])
    edit(summary)
    files["rate-2/replay.json"] = json.dumps(summary).encode()
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    with pytest.raises(USER_ERRORS) as e:
        build([tmp_path], slo_ttft_s=1.0)
    check_message(str(e.value), tmp_path / "rate-2" / "replay.json")
    assert message in str(e.value), str(e.value)[:300]


@pytest.mark.parametrize("name", ["x" * 300, "a\u2028b", "rate-9"])
@pytest.mark.parametrize("replicated", [True, False])
def test_a_sweep_naming_a_folder_without_a_replay_is_refused_naming_sweep_json(tmp_path, name, replicated):
    """Found by benchmarks/fuzz_readers.py: a name too long for the file system escaped as OSError;
    one without a replay was named raw (a line separator and all) instead of the sweep's field. A
    sweep's load names its replications' folders (--replications), or, written before them, one."""
    from kvaudit.reports.replay_report import build

    files = seed_files("replay_sweep")
    sweep = json.loads(files["sweep.json"])
    if replicated:
        sweep["loads"][0]["replications"][0]["dir"] = name
    else:
        del sweep["loads"][0]["replications"]
        sweep["loads"][0]["dir"] = name
    files["sweep.json"] = json.dumps(sweep).encode()
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    with pytest.raises(USER_ERRORS) as e:
        build([tmp_path])
    check_message(str(e.value), tmp_path / "sweep.json")
    assert ("field 'loads[0].replications[0].dir'" if replicated else "field 'loads[0].dir'") in str(e.value)
