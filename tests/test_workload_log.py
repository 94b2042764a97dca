"""`kvaudit generate workload --from-log`: chat, completions and plain logs as workloads, malformed
lines named (or refused with --strict), the reuse card, and a fuzzed reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvaudit.cli import main
from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.trace import read_trace
from kvaudit.generators.workload_log import import_log, read_log, reuse_card

SYSTEM = {"role": "system", "content": "You are a support bot."}
REFUND = {"role": "user", "content": "Doc: the refund policy is 30 days."}


def _words(text: str) -> int:
    return len(text.split())


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) and r.startswith("{") else json.dumps(r)) + "\n" for r in rows))
    return path


def test_a_chat_log_with_a_malformed_line_is_read_and_the_line_named(tmp_path, capsys):
    log = _write(tmp_path / "chat.jsonl", [
        {"custom_id": "a", "body": {"messages": [SYSTEM, REFUND, {"role": "user", "content": "How long?"}]}},
        '{"messages": [{"role": "user", "content": "cut off',
        {"messages": [SYSTEM, {"role": "user", "content": "Doc: shipping takes 5 days."}, REFUND,
                      {"role": "user", "content": [{"type": "text", "text": "And shipping?"}]}], "created": 7},
    ])
    out = tmp_path / "w.jsonl"
    assert main(["generate", "workload", "--from-log", str(log), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert f"{log}, line 2: skipped: not JSON" in cap.err
    trace = read_trace(out)  # the simulator and replay read it
    assert trace.n_requests == 2
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [p["kind"] for p in lines[1]["pieces"]] == ["prefix", "document", "document", "question"]
    assert lines[0]["pieces"][1]["id"] == lines[1]["pieces"][2]["id"]  # same text, same id
    assert lines[1]["timestamp"] == 7 and "text" not in lines[0]["pieces"][0]
    card = json.loads((tmp_path / "w.card.json").read_text())
    assert card["skipped"] == [{"line": 2, "reason": card["skipped"][0]["reason"]}] and card["requests"] == 2
    # line 2 of w repeats the system prompt (reachable by prefix) and the refund document behind
    # another document (not reachable)
    assert 0 < card["non_prefix_share_of_repeated"] < 1
    assert main(["generate", "workload", "--from-log", str(log), "--out", str(out), "--strict"]) == 2
    assert f"{log}, line 2: not JSON" in capsys.readouterr().err


def test_completions_and_plain_prompts_split_by_delimiter_and_regex(tmp_path):
    log = _write(tmp_path / "p.jsonl", [{"prompt": "sys##doc one##doc two##question?"}, "sys##doc two##q2",
                                        {"text": "just a question"}])
    res = import_log(log, "delimiter:##", _words)
    kinds = [[p["kind"] for p in r["pieces"]] for r in res.requests]
    assert kinds == [["prefix", "document", "document", "question"], ["prefix", "document", "question"], ["question"]]
    assert res.requests[0]["pieces"][2]["id"] == res.requests[1]["pieces"][1]["id"]
    res = import_log(log, r"regex:#{2}", _words, keep_text=True)
    assert res.requests[0]["pieces"][1]["text"] == "doc one"
    with pytest.raises(KvauditError, match="capturing groups"):
        import_log(log, "regex:(#)", _words)
    with pytest.raises(DatasetError, match="line 1: --split messages needs chat requests"):
        import_log(log, "messages", _words, strict=True)


def test_the_card_separates_prefix_reachable_from_non_prefix_repeats():
    def req(*ids):
        return {"pieces": [{"id": i, "tokens": 10} for i in ids]}

    card = reuse_card([req("S", "A", "B", "q1"), req("S", "A", "C", "q2"), req("S", "C", "A", "q3")])
    # request 2: S, A reachable (20); request 3: S reachable, C and A repeated behind another order (20)
    assert card["repeated_tokens"] == 50 and card["prefix_reachable_tokens"] == 30
    assert card["non_prefix_share_of_repeated"] == pytest.approx(20 / 50)


def test_a_log_with_nothing_readable_is_refused_naming_the_first_reason(tmp_path):
    log = _write(tmp_path / "bad.jsonl", [{"model": "x"}, [1, 2]])
    with pytest.raises(DatasetError, match=r"no request could be read \(2 lines skipped; first: line 1: no prompt"):
        read_log(log, "messages")


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
                         ["messages", "role", "content", "prompt", "text", "body", "type", "created", "id"]), c,
                         max_size=5), max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_json, min_size=1, max_size=4), split=st.sampled_from(["messages", "delimiter:,", "regex:a+"]))
def test_fuzzed_logs_give_a_workload_or_a_named_error(tmp_path, rows, split):
    log = tmp_path / "fuzz.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        res = import_log(log, split, _words)
    except DatasetError as e:
        assert str(log) in str(e)
        return
    for r in res.requests:
        assert r["pieces"] and all(p["tokens"] >= 1 and p["id"].startswith("c-") for p in r["pieces"])
    assert len(res.requests) + len(res.skipped) == sum(1 for _ in rows)


# --------------------------------------------------------------------------- issue 38: bounds


def _gen(log: Path, out: Path, *extra: str) -> int:
    return main(["generate", "workload", "--from-log", str(log), "--out", str(out), *extra])


def test_what_from_log_names_is_said_as_it_is(tmp_path, capsys):
    """/dev/null and a folder were "file not found"."""
    import os

    (tmp_path / "empty.jsonl").write_bytes(b"")
    os.mkfifo(tmp_path / "fifo")
    for path, message in ((Path("/dev/null"), "not a regular file (a character device)"),
                          (tmp_path, "is a directory, not a file"),
                          (tmp_path / "fifo", "not a regular file (a pipe)"),
                          (tmp_path / "empty.jsonl", "empty (0 bytes)"),
                          (tmp_path / "nothing.jsonl", "file not found")):
        assert _gen(path, tmp_path / "w.jsonl") == 2
        assert f"{path}: {message}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl", "fifo"]


def test_a_line_over_the_limit_is_refused_naming_it(tmp_path, capsys):
    """A 50 MB line once ran 460 s at 2.7 GB: a line is read with a bound (--max-line-bytes)."""
    log = _write(tmp_path / "log.jsonl", [{"prompt": "a##b"}, {"prompt": "x" * 200}])
    with pytest.raises(DatasetError, match=r"log\.jsonl, line 2: longer than 100 bytes \(--max-line-bytes"):
        read_log(log, "delimiter:##", max_line_bytes=100)
    n = len(json.dumps({"prompt": "x" * 200}))  # the limit counts a line's bytes without its newline
    assert len(read_log(log, "delimiter:##", max_line_bytes=n)[0]) == 2
    with pytest.raises(DatasetError, match="line 2: longer than"):
        read_log(log, "delimiter:##", max_line_bytes=n - 1)
    assert len(read_log(log, "delimiter:##", max_line_bytes=0)[0]) == 2  # 0: no limit
    (tmp_path / "big.jsonl").write_bytes(b'{"prompt": "' + b"word " * 2_000_000 + b'"}\n')
    assert _gen(tmp_path / "big.jsonl", tmp_path / "w.jsonl", "--split", "delimiter: ") == 2
    assert "big.jsonl, line 1: longer than 8388608 bytes" in capsys.readouterr().err


@pytest.mark.parametrize("split, row", [
    ("delimiter: ", {"prompt": "w " * 5000}),
    ("regex: +", {"prompt": "w " * 5000}),
    ("messages", {"messages": [{"role": "user", "content": "hi"}] * 5000}),
])
def test_a_request_of_too_many_pieces_is_refused_naming_it(tmp_path, capsys, split, row):
    log = _write(tmp_path / "log.jsonl", [{"messages": [SYSTEM, REFUND], "prompt": "a b"}, row])
    assert _gen(log, tmp_path / "w.jsonl", "--split", split) == 2
    err = capsys.readouterr().err
    assert f"log.jsonl, line 2: --split {split!r} cuts this request into more than 4096 pieces (--max-pieces)" in err
    assert not (tmp_path / "w.jsonl").exists()
    assert len(read_log(log, split, max_pieces=5001)[0]) == 2


def test_a_catastrophic_regex_ends_in_seconds_naming_the_option(tmp_path, capsys):
    """(?:a|aa)+$ on 30,000 characters backtracked for over 150 s."""
    import time

    log = _write(tmp_path / "log.jsonl", [{"prompt": "a" * 30_000 + "b"}])
    t0 = time.monotonic()
    assert _gen(log, tmp_path / "w.jsonl", "--split", "regex:(?:a|aa)+$") == 2
    assert time.monotonic() - t0 < 15
    assert "--split 'regex:(?:a|aa)+$': matching took over 2 s on" in capsys.readouterr().err
    assert not (tmp_path / "w.jsonl").exists()


@pytest.mark.parametrize("raw, reason", [
    (b'{"prompt": "caf\xe9"}', "not UTF-8 text (byte 15 of the line)"),
    (b'{"prompt": 1' + b"0" * 5000 + b"}", "unreadable JSON value"),
    (b'{"prompt": "a\\ud800"}', "field 'prompt' is not Unicode text"),
    (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "JSON nested too deeply"),
])
def test_an_unreadable_line_is_skipped_and_named(tmp_path, raw, reason):
    log = tmp_path / "log.jsonl"
    log.write_bytes(b'{"prompt": "a##b"}\n' + raw + b"\n")
    requests, skipped = read_log(log, "delimiter:##")
    assert len(requests) == 1 and skipped[0]["line"] == 2 and skipped[0]["reason"].startswith(reason)


def test_lines_end_at_newlines_only(tmp_path):
    """A raw U+2028 inside a JSON string is no line break (str.splitlines took it for one)."""
    log = tmp_path / "log.jsonl"
    log.write_text('\ufeff{"prompt": "a\u2028b##c"}\r\n{"prompt": "d\x85e"}\n', encoding="utf-8")
    requests, skipped = read_log(log, "delimiter:##")
    assert skipped == [] and [r.pieces for r in requests] == [[("prefix", "a\u2028b"), ("question", "c")],
                                                              [("question", "d\x85e")]]


def _rag_log(path: Path, n: int = 30) -> Path:
    """A RAG request log as teams keep it: the retrieved documents pasted into the one user message
    between '[Document k]' markers, behind a per-request timestamp, the question last."""
    import random

    rng = random.Random(0)
    docs = [" ".join(f"Film {d} earned {d * 7 + k} million dollars in week {k} of its run across the country."
                     for k in range(6)) for d in range(8)]
    rows = []
    for i in range(n):
        picked = rng.sample(range(8), 3)
        body = "\n\n".join(f"[Document {j + 1}]\n{docs[d]}" for j, d in enumerate(picked))
        user = f"Time: 2026-12-04T10:{i:02d}:00\n\n{body}\n\nQuestion: which film earned most in week {i % 6}?"
        rows.append({"messages": [SYSTEM, {"role": "user", "content": user}]})
    return _write(path, rows)


def test_documents_inside_one_message_import_with_a_warning_and_the_split_that_finds_them(tmp_path, capsys):
    """Issue 42: under the default split such a log reads as almost nothing repeated, silently; now
    the import warns, naming a split, and that split finds the documents (each repeated whole)."""
    log = _rag_log(tmp_path / "rag.jsonl")
    out = tmp_path / "w.jsonl"
    assert main(["generate", "workload", "--from-log", str(log), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    card = json.loads((tmp_path / "w.card.json").read_text())
    assert card["repeated_share"] < 0.05 and card["repeated_line_share"] > 0.5
    split = r"regex:\n*\[Document \d+\]\n*|\n+(?=Question:)"
    assert "warning: --split messages found" in cap.err and f"--split '{split}'" in cap.err
    assert main(["generate", "workload", "--from-log", str(log), "--out", str(out), "--split", split]) == 0
    cap = capsys.readouterr()
    card = json.loads((tmp_path / "w.card.json").read_text())
    assert card["repeated_share"] > 0.7 and "warning" not in cap.err
    kinds = [p["kind"] for p in json.loads(out.read_text().splitlines()[0])["pieces"]]
    assert kinds == ["prefix", "document", "document", "document", "question"]
